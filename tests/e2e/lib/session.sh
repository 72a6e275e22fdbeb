# session.sh - a private tmux server and temp folder for the e2e scripts
# whose wait_for takes the session first (attach.sh, kv_events.sh).
# Source it with $sock set (the tmux socket name) and optionally $keep_s
# (how long the keep-alive session lives). Sets T (a temp folder removed on
# exit with the tmux server and every pid in PIDS) and defines tm, cap and
# wait_for SESSION PATTERN [SECONDS] (polls the screen until it matches an
# extended regex; 1 when it never does).
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
