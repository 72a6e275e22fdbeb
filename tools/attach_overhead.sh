#!/usr/bin/env bash
# attach_overhead.sh - what `kvtop attach` costs the machine it runs on and
# the server it watches: starts `kvtop serve` (idle) on MODEL, runs
# `kvtop attach --frames N` in tmux at 10 fps, and prints
# attach's own report (requests sent, snapshots taken in, process CPU).
# Usage: [MODEL=path.gguf] tools/attach_overhead.sh [SECONDS (default 30)] [URL ...]
# MODEL: the served model (default stories260K, whose 256 MiB KV budget makes
# 26214 blocks: a 690 KB snapshot per frame; SmolLM2 makes 728).
# URLs (e.g. a llama-server) are attached instead of the kvtop server.
set -eu
secs=${1:-30}
shift || true
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
T=$(mktemp -d)
trap 'kill $SPID 2>/dev/null; tmux -L ovh kill-server 2>/dev/null; rm -rf "$T"' EXIT
"$K" serve profiles/default.yaml --set model.path="${MODEL:-$S/models/stories260K.gguf}" --set threads=1 \
  --host 127.0.0.1 --port 0 </dev/null >"$T/serve.log" 2>&1 &
SPID=$!
for _ in $(seq 1 300); do grep -q 'kvtop serve: ready' "$T/serve.log" && break; sleep 0.1; done
BASE=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/serve.log" | head -n 1)
urls=${*:-$BASE}
tmux -L ovh -f /dev/null new-session -d -s o -x 160 -y 45 \
  "$K attach $urls --frames $((secs * 10)) 2>$T/report; echo done >$T/done"
for _ in $(seq 1 $((secs * 10 + 300))); do [[ -f $T/done ]] && break; sleep 0.1; done
echo "attach for ${secs}s at 10 fps on: $urls"
cat "$T/report"
