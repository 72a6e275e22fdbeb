#!/usr/bin/env bash
# decode_profile.sh - the README's "Where decode time goes" set: per-op
# shares of a decode step (build/tools/decode_profile) for the 110M q8_0 and
# q4_0 shapes and SmolLM2 at one stream, and the 110M q8_0 shape at 64
# concurrent with and without a snapshot per step (--hook 1, as the TUI and
# bench take one). The random 110M models are made under build/models/ with
# the same command as `make bench-models`.
#
#   make && tools/decode_profile.sh [TOKENS] [TOKENS_AT_64]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-64}
N64=${2:-24}
T=${THREADS:-2}
P=build/tools/decode_profile
mkdir -p build/models
for t in q8_0 q4_0; do
  f=build/models/rand-110m-$t.gguf
  [[ -f $f ]] || ./kvtop mkmodel --dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048 --vocab 32000 \
    --ctx 2048 --untied --type $t -o "$f" > /dev/null
done
for m in build/models/rand-110m-q8_0.gguf build/models/rand-110m-q4_0.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf; do
  [[ -f $m ]] || { echo "decode_profile.sh: $m missing, skipped"; continue; }
  $P --model "$m" --threads "$T" --concurrency 1 --prompt 32 --tokens "$N"
  echo
done
for hook in 0 1; do
  $P --model build/models/rand-110m-q8_0.gguf --threads "$T" --concurrency 64 --prompt 128 --tokens "$N64" --hook $hook
  echo
done
# The same split by function, with no timers in the way: perf's samples of
# plain `kvtop generate` (perf_event_paranoid <= 2 lets a user profile their
# own process). PERF=0 skips it.
if [[ ${PERF:-1} == 1 ]] && command -v perf > /dev/null; then
  d=build/decode_profile.perf.data
  perf record -q -F 999 -g -o "$d" ./kvtop generate -m build/models/rand-110m-q8_0.gguf -p "hello world" -n "$N" \
    --temp 0 --ignore-eos -t "$T" > /dev/null 2>&1 &&
    perf report -i "$d" --no-children --sort symbol --stdio 2> /dev/null | grep -E '^ +[0-9]' | head -15
fi
