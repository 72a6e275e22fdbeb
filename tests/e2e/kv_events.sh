#!/usr/bin/env bash
# End-to-end check of `kvtop attach --kv-events`, driven through tmux at
# 160x45, against tests/fixtures/attach/kv_event_publisher.py (vLLM's wire
# format: ZMQ PUB [topic, seq, msgpack EventBatch], a ROUTER replay socket,
# a vLLM-looking /metrics):
#  - array layout (msgspec array_like, int hashes) with --kv-replay: the 5
#    batches sent before attach subscribed and the one withheld from PUB
#    come through the replay socket; the block panel's counts (resident,
#    stored, removed, cleared, chains, shared, hit potential) equal the
#    publisher's own reference tree of every batch, with no gap left;
#  - map layout (vLLM's newest KVCacheEvent, 32-byte hashes) without
#    replay: the withheld batch shows as one gap, one batch missed, and the
#    counts equal the reference without it; a payload that is not msgpack
#    and a two-part message are counted as bad and change nothing.
# Skipped (said, not counted as passed) without libzmq in this build or
# without pyzmq/msgpack (make pydeps). Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && printf '%s\n' "$2" | head -n 50 | sed 's/^/     | /'; }
check() { if eval "$2"; then ok "$1"; else bad "$1" "${3:-}"; fi; }
if "$K" attach --help | grep -q 'no libzmq'; then
  echo "  skipped: this kvtop was built without libzmq (apt-get install libzmq3-dev, make): kvtop attach --kv-events"
  echo "$pass passed, $fail failed"
  exit 0
fi
export PYTHONPATH=build/pydeps_kv${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import zmq, msgpack' 2>/dev/null; then
  echo "  skipped: pyzmq and msgpack are not installed (make pydeps): kvtop attach --kv-events"
  echo "$pass passed, $fail failed"
  exit 0
fi
for t in tmux python3; do
  command -v $t >/dev/null || { echo "FAIL $t is not installed (make setup)"; echo "0 passed, 1 failed"; exit 1; }
done
sock=kvtop-kvev-$$
keep_s=300
. "$(dirname "$0")/lib/session.sh"
wait_file() {
  local i
  for ((i = 0; i < ${2:-100}; i++)); do [[ -s $1 ]] && return 0; sleep 0.1; done
  return 1
}
# publisher DIR LAYOUT EARLY: starts one, sets HTTP PUB REP
publisher() {
  mkdir -p "$1"
  python3 tests/fixtures/attach/kv_event_publisher.py "$1" "$2" "$3" 2>"$1/err" &
  PIDS+=($!)
  if ! wait_file "$1/ports" 100; then
    bad "the KV-event publisher starts ($2)" "$(cat "$1/err")"
    return 1
  fi
  read -r HTTP PUB REP <"$1/ports"
}
# counts_re "R S X C L SH HP": the block panel's lines for these figures
counts_re() {
  read -r r s x c l sh hp <<<"$1"
  echo "resident $r blk .*chains $l  shared $sh blk  hit potential $hp%"
}
stored_re() {
  read -r r s x c l sh hp <<<"$1"
  echo "stored $s  removed $x \\([0-9]+ not resident\\)  cleared $c  roots"
}

# ---- array layout, with replay ----
if publisher "$T/a" array 5; then
  tm new-session -d -s a -x 160 -y 45 "$K attach http://127.0.0.1:$HTTP --kv-events tcp://127.0.0.1:$PUB --kv-replay tcp://127.0.0.1:$REP 2>$T/a.err; echo EXITED rc=\$?; sleep 60"
  check "attach detects vLLM and draws the prefix tree panel" "wait_for a 'prefix tree from KV events' 15 && wait_for a ' vllm' 10" "$(cap a; cat $T/a.err)"
  check "the early batches come through the replay socket" "wait_for a 'batches 5 ' 10" "$(cap a)"
  touch "$T/a/go"
  wait_file "$T/a/expect" 100
  want=$(sed -n 's/^full //p' "$T/a/expect")
  check "tree counts equal the publisher's reference ($want)" \
    "wait_for a '$(counts_re "$want")' 10 && wait_for a '$(stored_re "$want")' 3" "$(cap a)"
  check "the withheld batch was replayed: no gap, nothing bad" \
    "wait_for a 'batches 24  seq 23  gaps 0 \\(0 missed\\)  bad 0' 5 && wait_for a 'replayed [0-9]+ in 2 req' 3" "$(cap a)"
  check "the families and evictions are listed" "wait_for a '│A [0-9]+ blk  longest chain [0-9]+  leaves' 3 && wait_for a 'evicted: [0-9]+ blk.* d[0-9]+ t-' 3" "$(cap a)"
  tm send-keys -t a C-c
  check "attach exits cleanly" "wait_for a 'EXITED rc=0' 10" "$(cap a; cat $T/a.err)"
fi

# ---- map layout, no replay, hostile frames at the end ----
if publisher "$T/m" map 0; then
  tm new-session -d -s m -x 160 -y 45 "$K attach http://127.0.0.1:$HTTP --kv-events tcp://127.0.0.1:$PUB 2>$T/m.err; echo EXITED rc=\$?; sleep 60"
  check "attach waits for the first batch" "wait_for m 'waiting for the first KV-event batch' 15" "$(cap m)"
  sleep 1 # the subscription reaches the PUB socket
  touch "$T/m/go"
  wait_file "$T/m/expect" 100
  want=$(sed -n 's/^nogap //p' "$T/m/expect")
  check "map layout: counts equal the reference without the withheld batch ($want)" \
    "wait_for m '$(counts_re "$want")' 10 && wait_for m '$(stored_re "$want")' 3" "$(cap m)"
  check "the withheld batch shows as a gap; garbage counted as bad" \
    "wait_for m 'batches 23  seq 24  gaps 1 \\(1 missed\\)  bad 2' 5" "$(cap m)"
  check "the refused payload's reason is shown" "wait_for m 'last refused: KV-event batch' 3" "$(cap m)"
  tm send-keys -t m C-c
  check "attach exits cleanly" "wait_for m 'EXITED rc=0' 10" "$(cap m; cat $T/m.err)"
fi
echo "$pass passed, $fail failed"
(( fail == 0 ))
