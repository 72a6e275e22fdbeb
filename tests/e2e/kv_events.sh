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
if "$K" attach --help | grep -q 'no libzmq'; then
  echo "  skipped: this kvtop was built without libzmq (apt-get install libzmq3-dev, make): kvtop attach --kv-events"
  echo "0 passed, 0 failed"
  exit 0
fi
export PYTHONPATH=build/pydeps_kv${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import zmq, msgpack' 2>/dev/null; then
  echo "  skipped: pyzmq and msgpack are not installed (make pydeps): kvtop attach --kv-events"
  echo "0 passed, 0 failed"
  exit 0
fi
sock=kvtop-kvev-$$ keep_s=300 need="tmux python3"
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

# start_case SES LAYOUT EARLY [replay]: a publisher in $T/SES sending EARLY
# batches before attach subscribes, and attach on it in tmux session SES.
start_case() {
  publisher "$T/$1" "$2" "$3" || return 1
  local rep=""
  [[ ${4:-} == replay ]] && rep="--kv-replay tcp://127.0.0.1:$REP"
  tm new-session -d -s "$1" -x 160 -y 45 "$K attach http://127.0.0.1:$HTTP --kv-events tcp://127.0.0.1:$PUB $rep 2>$T/$1.err; echo EXITED rc=\$?; sleep 60"
}
# release_case SES KEY: lets the publisher send the rest; prints its
# reference figures of kind KEY (full: every batch; nogap: without the
# withheld one).
release_case() {
  touch "$T/$1/go"
  wait_file "$T/$1/expect" 100
  sed -n "s/^$2 //p" "$T/$1/expect"
}
check_counts() { # SES WANT WHAT
  check "$3 ($2)" "wait_for $1 '$(counts_re "$2")' 10 && wait_for $1 '$(stored_re "$2")' 3" "$(cap "$1")"
}
quit_case() {
  tm send-keys -t "$1" C-c
  check "attach exits cleanly" "wait_for $1 'EXITED rc=0' 10" "$(cap "$1"; cat "$T/$1.err")"
}

# ---- array layout, with replay ----
if start_case a array 5 replay; then
  check "attach detects vLLM and draws the prefix tree panel" "wait_for a 'prefix tree from KV events' 15 && wait_for a ' vllm' 10" "$(cap a; cat $T/a.err)"
  check "the early batches come through the replay socket" "wait_for a 'batches 5 ' 10" "$(cap a)"
  check_counts a "$(release_case a full)" "tree counts equal the publisher's reference"
  check "the withheld batch was replayed: no gap, nothing bad" \
    "wait_for a 'batches 24  seq 23  gaps 0 \\(0 missed\\)  bad 0' 5 && wait_for a 'replayed [0-9]+ in 2 req' 3" "$(cap a)"
  check "the families and evictions are listed" "wait_for a '│A [0-9]+ blk  longest chain [0-9]+  leaves' 3 && wait_for a 'evicted: [0-9]+ blk.* d[0-9]+ t-' 3" "$(cap a)"
  quit_case a
fi

# ---- map layout, no replay, hostile frames at the end ----
if start_case m map 0; then
  check "attach waits for the first batch" "wait_for m 'waiting for the first KV-event batch' 15" "$(cap m)"
  sleep 1 # the subscription reaches the PUB socket
  check_counts m "$(release_case m nogap)" "map layout: counts equal the reference without the withheld batch"
  check "the withheld batch shows as a gap; garbage counted as bad" \
    "wait_for m 'batches 23  seq 24  gaps 1 \\(1 missed\\)  bad 2' 5" "$(cap m)"
  check "the refused payload's reason is shown" "wait_for m 'last refused: KV-event batch' 3" "$(cap m)"
  quit_case m
fi
echo "$pass passed, $fail failed"
(( fail == 0 ))
