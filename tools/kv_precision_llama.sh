#!/usr/bin/env bash
# kv_precision_llama.sh - llama.cpp's side of the README's "f16 vs f32 KV
# precision" figures: the KL divergence and top-1 agreement of an f16 KV
# cache against an f32 one (llama-perplexity --kl-divergence-base /
# --kl-divergence, the same text and weights as build/tools/kv_precision),
# with flash attention on and off, and how many greedy texts change between
# the two caches (llama-completion, temperature 0), for each FA setting.
#
#   LLAMA_CPP_BIN=.../llama.cpp/build/bin tools/kv_precision_llama.sh \
#       [MODEL] [TEXT] [PROMPTS.jsonl] [N_TOKENS] [CTX]
#
# Defaults: SmolLM2-135M-Instruct.Q4_1, data/eval/kvtop-eval.txt,
# data/spec/stories.jsonl + repetitive.jsonl, 64 tokens, ctx 256. Work files
# go to build/kv_precision_llama/. Exits 0 with a note when llama.cpp is
# not found (LLAMA_CPP_BIN unset and none under build/llama.cpp/bin).
# KL=0 skips the perplexity part, GREEDY=0 the greedy part; FA="on off"
# (the default) picks the flash-attention settings. THREADS (default 2) sets -t;
# on a loaded machine use THREADS=1 OMP_WAIT_POLICY=passive (two spinning
# OpenMP threads with one descheduled ran 20x slower). The README's greedy
# count: KL=0 FA=off THREADS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLAMA_CPP_BIN:-build/llama.cpp/bin}
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${2:-data/eval/kvtop-eval.txt}
PROMPTS=${3:-}
N=${4:-64}
CTX=${5:-256}
THREADS=${THREADS:-2}
FA=${FA:-on off}
if [ ! -x "$BIN/llama-perplexity" ] || [ ! -x "$BIN/llama-completion" ]; then
  echo "kv_precision_llama: SKIP: no llama-perplexity / llama-completion in $BIN (set LLAMA_CPP_BIN)"
  exit 0
fi
W=build/kv_precision_llama
mkdir -p "$W"
if [ -z "$PROMPTS" ]; then
  PROMPTS=$W/prompts.jsonl
  cat data/spec/stories.jsonl data/spec/repetitive.jsonl > "$PROMPTS"
fi

ppl() { "$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$THREADS" "$@"; }
kl_row() { # fa, log
  local mean top maxk
  mean=$(sed -n 's/^Mean    KLD: *\([^ ]*\).*/\1/p' "$2")
  maxk=$(sed -n 's/^Maximum KLD: *\([^ ]*\).*/\1/p' "$2")
  top=$(sed -n 's/^Same top p: *\([^ ]*\).*/\1/p' "$2")
  echo "| llama.cpp | $1 | f32 | f16 | $mean | $maxk | $top% |"
}

if [[ ${KL:-1} == 1 ]]; then
echo "## KL(f32 KV || f16 KV), $MODEL, $TEXT, ctx $CTX, $THREADS threads"
echo "| program | flash attention | ref KV | cfg KV | mean KL | max KL | same top-1 |"
echo "|---|---|---|---|---|---|---|"
for fa in $FA; do
  ppl -ctk f32 -ctv f32 -fa $fa --kl-divergence-base "$W/base_$fa.kld" > "$W/base_$fa.log" 2>&1
  ppl -ctk f16 -ctv f16 -fa $fa --kl-divergence-base "$W/base_$fa.kld" --kl-divergence > "$W/kl_$fa.log" 2>&1
  kl_row "$fa" "$W/kl_$fa.log"
done
echo "(with FA on, llama.cpp casts an f32 cache to f16 before flash attention: src/llama-graph.cpp, build_attn_mha)"
fi
[[ ${GREEDY:-1} == 1 ]] || exit 0

echo
echo "## greedy texts, $N tokens, f16 vs f32 KV"
n_prompts=$(grep -c . "$PROMPTS")
for fa in $FA; do
  changed=0
  for i in $(seq 1 "$n_prompts"); do
    p=$(sed -n "${i}p" "$PROMPTS" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["prompt"], end="")')
    for kv in f32 f16; do
      "$BIN/llama-completion" -m "$MODEL" -p "$p" -n "$N" --temp 0 --top-k 1 -s 1 -t "$THREADS" -no-cnv \
        --no-display-prompt --simple-io --no-warmup -ctk $kv -ctv $kv -fa $fa > "$W/gen_${fa}_${kv}_$i.txt" 2>/dev/null
    done
    cmp -s "$W/gen_${fa}_f32_$i.txt" "$W/gen_${fa}_f16_$i.txt" || changed=$((changed + 1))
  done
  echo "llama.cpp, flash attention $fa: $changed of $n_prompts greedy texts change between f32 and f16 KV"
done
