# session.sh - a private tmux server and temp folder for the e2e scripts
# whose wait_for takes the session first (attach.sh, kv_events.sh).
# Source it with $sock set (the tmux socket name), $need (the commands the
# script needs: missing ones fail the script, naming `make setup`) and
# optionally $keep_s (how long the keep-alive session lives). Defines the
# counters pass and fail with ok WHAT, bad WHAT [GOT] (GOT shown as its
# first 50 lines) and check WHAT COND [GOT] (ok when COND, eval'ed, holds);
# sets T (a temp folder removed on exit with the tmux server and every pid
# in PIDS) and defines tm, cap and wait_for SESSION PATTERN [SECONDS]
# (polls the screen until it matches an extended regex; 1 when it never
# does).
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && printf '%s\n' "$2" | head -n 50 | sed 's/^/     | /'; }
check() { if eval "$2"; then ok "$1"; else bad "$1" "${3:-}"; fi; }
for t in ${need:-tmux}; do
  command -v "$t" >/dev/null || { echo "FAIL $t is not installed (make setup)"; echo "0 passed, 1 failed"; exit 1; }
done
T=$(mktemp -d)
tm() { tmux -L "$sock" -f /dev/null "$@"; }
PIDS=()
trap 'tm kill-server 2>/dev/null; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
export XDG_STATE_HOME=$T/state
tm new-session -d -s keep "sleep ${keep_s:-900}"
cap() { tm capture-pane -p -t "$1"; }
wait_for() {
  local ses=$1 pat=$2 t=${3:-10} i
  for ((i = 0; i < t * 10; i++)); do
    cap "$ses" | grep -Eq -- "$pat" && return 0
    sleep 0.1
  done
  return 1
}
