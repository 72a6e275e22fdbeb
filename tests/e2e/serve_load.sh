#!/usr/bin/env bash
# `kvtop serve` held under load and bad input, on stories260K (fast on two
# cores): 64 concurrent streaming clients over 256 requests with consistent
# usage, disconnects cancelled within a step with no leaked block, 429 past
# server.max_queue while /health answers, slow and silent connections
# dropped, 1,000 malformed requests each a 4xx with flat memory, and SIGTERM
# with a stream in flight (an error event, [DONE], exit 0). The checks are
# tests/server/py/load.py; loopback only, every wait bounded.
# Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
T=$(mktemp -d)
SP=
trap '[[ -n $SP ]] && kill $SP 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
export PYTHONPATH=build/pydeps${PYTHONPATH:+:$PYTHONPATH}
# Under AddressSanitizer (make sanitize) freed memory waits in a quarantine
# that would read as growth in the flat-memory check: keep it small.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16
"$K" serve profiles/default.yaml --set model.path="$S/models/stories260K.gguf" --set threads=2 \
  --set scheduler.max_seqs=16 --set server.max_queue=48 --set server.header_timeout_ms=1000 \
  --set server.idle_timeout_ms=2000 --set server.shutdown_grace_ms=300 --api-key LOADKEY \
  --host 127.0.0.1 --port 0 </dev/null >"$T/serve.log" 2>&1 &
SP=$!
for _ in $(seq 1 300); do
  grep -q 'kvtop serve: ready' "$T/serve.log" && break
  kill -0 $SP 2>/dev/null || break
  sleep 0.1
done
if ! grep -q 'kvtop serve: ready' "$T/serve.log"; then
  echo "FAIL kvtop serve did not start: $(tail -n 3 "$T/serve.log")"
  echo "0 passed, 1 failed"
  exit 1
fi
BASE=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/serve.log" | head -n 1)
timeout 300 python3 tests/server/py/load.py "$BASE" "$SP" LOADKEY >"$T/out" 2>&1
cat "$T/out" | sed '$d'
line=$(tail -n 1 "$T/out")
p=$(echo "$line" | grep -oE '^[0-9]+' || echo 0)
f=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '^[0-9]+' || echo 1)
[[ $line =~ passed ]] || { echo "FAIL load.py: $(tail -n 5 "$T/out")"; f=$((f + 1)); }
for _ in $(seq 1 100); do kill -0 $SP 2>/dev/null || break; sleep 0.1; done
wait $SP; rc=$?
SP=
if [[ $rc == 0 ]] && grep -q 'kvtop serve: stopped' "$T/serve.log"; then
  echo "  ok the server exits 0 after SIGTERM"; p=$((p + 1))
else
  echo "FAIL server exit status $rc: $(tail -n 3 "$T/serve.log")"; f=$((f + 1))
fi
echo "$p passed, $f failed"
