# tests/e2e/lib/tmux.sh - what every tmux-driven e2e test shares (sourced, not run):
# the pass/fail counters and their report, a private tmux server that
# outlives the sessions under test, screen capture and polling.
# Before sourcing: set TMUX_NAME (the socket's and default session's stem).
# After: K (absolute kvtop binary), S (shared folder), tmp (a temp folder
# removed at exit, XDG_STATE_HOME inside it), s (the default session),
# tm, cap, wait_for, ok, bad, finish.
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && printf '%s\n' "$2" | head -n 45 | sed 's/^/     | /'; }
# finish: the closing "N passed, N failed" line; the status says whether all held.
finish() { echo "$pass passed, $fail failed"; ((fail == 0)); }
if ! command -v tmux >/dev/null; then
  echo "FAIL tmux is not installed (make setup)"
  echo "0 passed, 1 failed"
  exit 1
fi
K=$(cd "$(dirname "$K")" && pwd)/$(basename "$K")
tmp=$(mktemp -d)
s=${TMUX_NAME:-kvtop-e2e}
# A private tmux server: the user's sessions and environment stay out of it.
sock=$s-$$
tm() { tmux -L "$sock" -f /dev/null "$@"; }
trap 'tm kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
export XDG_STATE_HOME=$tmp/state
cap() { tm capture-pane -p -t "${1:-$s}"; }
# A session that outlives the others, so the server does not exit between them.
tm new-session -d -s keep "sleep 600"
# wait_for PATTERN [SECONDS] [SESSION]: polls the screen until it matches (extended regex).
wait_for() {
  local pat=$1 t=${2:-5} ses=${3:-$s} i
  for ((i = 0; i < t * 10; i++)); do
    cap "$ses" | grep -Eq -- "$pat" && return 0
    sleep 0.1
  done
  return 1
}
