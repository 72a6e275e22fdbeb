#!/usr/bin/env bash
# speed_table.sh - issue 15's side-by-side speed table: kvtop and llama.cpp
# alternating in one run (llama.cpp first, then kvtop, for every row and
# every repeat), 2 threads each, medians and min-max over the repeats, and
# the read-bandwidth ceiling kvtop measures in each `generate --stats` run.
#
#   make && make models bench-models
#   tools/speed_table.sh [--rows decode,prefill,conc,long] [--repeats N]
#                        [--models 110m-q8_0,smollm2,...] [--out DIR]
#
# Rows (all 2 threads; THREADS= overrides):
#   decode   1 stream: llama-bench tg128 vs kvtop generate -n 128 --stats
#            (decode tok/s and its share of the ceiling = bandwidth / weight
#            bytes per token) on the 110M shape in f32 f16 q8_0 q4_0 q4_1
#            q4_k_m, the 1B shape in q8_0 q4_0 q4_k_m, SmolLM2 Q4_1, Gemma 3
#            270M Q4_K_M (rows whose model file is missing are skipped)
#   prefill  llama-bench pp512 vs kvtop generate on a ~509-token prompt, -n 1
#            (110M q8_0 q4_0 f32; stories260K at 256 tokens)
#   conc     aggregate decode, 32 and 64 concurrent, 110M q8_0:
#            llama-batched-bench S_TG (128 + 128 tokens, best of -fa on/off)
#            vs kvtop bench profiles/bench-concurrency.yaml: output tok/s of
#            a closed loop of 2x N requests (prefill included), and
#            decode_step_tokens_per_s of one wave of N requests sent at
#            once (prefill left out, as S_TG: the like-for-like figure)
#   long     SmolLM2 decode after 2,048 and 8,000 tokens of context:
#            llama-bench -d D -n 32 -fa 1 with f16 and q8_0 K/V vs kvtop
#            bench with one D-token request, 64 output tokens, 1000 / TPOT
#            p50, kv f16, int8 and fp8_e4m3. LONG_MODEL=smol32k and
#            LONG_DEPTHS="16384" run it past SmolLM2's 8K context on a
#            random SmolLM2-shaped Q8_0 model with a 32K context
#            (`make models/rand-smol32k-q8_0.gguf`).
# Raw outputs go to DIR (default build/speed/DATE-TIME), with `uptime`
# before and after the run; tools/speed_table.py DIR prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KVTOP_BIN:-./kvtop}
LL=${KVTOP_LLAMA_DIR:-build/llama.cpp}
B=$LL/build/bin
T=${THREADS:-2}
ROWS=decode,prefill,conc,long
REPS=3
MODELS=
OUT=build/speed/$(date -u +%Y%m%d-%H%M%S)
while (($#)); do
  case $1 in
    --rows) ROWS=$2; shift 2 ;;
    --repeats) REPS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "speed_table: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for row in ${ROWS//,/ }; do
  [[ $row =~ ^(decode|prefill|conc|long)$ ]] || { echo "speed_table: unknown row $row (decode, prefill, conc, long)" >&2; exit 2; }
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || { echo "speed_table: --repeats wants a positive integer" >&2; exit 2; }
[[ -x $K ]] || { echo "speed_table: needs $K (make)" >&2; exit 1; }
[[ -x $B/llama-bench && -x $B/llama-batched-bench ]] || { echo "speed_table: no llama.cpp build at $LL" >&2; exit 1; }
export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"

declare -A PATHS=(
  [110m-f32]=models/rand-110m-f32.gguf [110m-f16]=models/rand-110m-f16.gguf
  [110m-q8_0]=models/rand-110m-q8_0.gguf [110m-q4_0]=models/rand-110m-q4_0.gguf
  [110m-q4_1]=models/rand-110m-q4_1.gguf [110m-q4_k_m]=models/rand-110m-q4_k_m.gguf
  [1b-q8_0]=models/rand-1b-q8_0.gguf [1b-q4_0]=models/rand-1b-q4_0.gguf
  [1b-q4_k_m]=models/rand-1b-q4_k_m.gguf
  [smollm2]=models/SmolLM2-135M-Instruct.Q4_1.gguf [gemma3]=models/gemma-3-270m-Q4_K_M.gguf
  [smol32k]=models/rand-smol32k-q8_0.gguf
  [stories260k]=${STORIES_GGUF:-../shared/models/stories260K.gguf}
)
DECODE_SET=110m-f32,110m-f16,110m-q8_0,110m-q4_0,110m-q4_1,110m-q4_k_m,1b-q8_0,1b-q4_0,1b-q4_k_m,smollm2,gemma3
PREFILL_SET=110m-q8_0,110m-q4_0,110m-f32,stories260k
has_row() { [[ ,$ROWS, == *,$1,* ]]; }
wanted() { [[ -z $MODELS || ,$MODELS, == *,$1,* ]] && [[ -f ${PATHS[$1]} ]]; }
log() { printf '%s\n' "$*" >&2; }

# A prompt of at most N tokens of this model's tokenizer, cut from the eval
# text (repeated as needed); writes FILE and prints its token count.
make_prompt() { # MODEL N FILE
  local m=$1 n=$2 f=$3 chars=$(($2 * 5)) got
  while :; do
    python3 -c "import sys; t=open('data/eval/kvtop-eval.txt').read(); n=int(sys.argv[1]); \
sys.stdout.write((t * (n // len(t) + 1))[:n])" "$chars" > "$f"
    got=$("$K" tokenize -m "$m" -f "$f" | wc -w)
    ((got <= n)) && break
    chars=$((chars * n / got - 8))
  done
  echo "$got"
}

uptime > "$OUT/uptime-start.txt"
{ echo "threads $T"; echo "repeats $REPS"; echo "rows $ROWS"; echo "long-context model ${LONG_MODEL:-smollm2}"
  git log -1 --format='kvtop %h %s'; } > "$OUT/run.txt"
for ((r = 1; r <= REPS; r++)); do
  if has_row decode; then
    for id in ${DECODE_SET//,/ }; do
      wanted "$id" || continue
      m=${PATHS[$id]}
      log "[$r/$REPS] decode $id"
      "$B/llama-bench" -m "$m" -t "$T" -p 0 -n 128 -r 1 -o json > "$OUT/decode__llama__${id}__r$r.json" 2> /dev/null
      "$K" generate -m "$m" -p "hello world" -n 128 --temp 0 --ignore-eos --stats -t "$T" \
        2> "$OUT/decode__kvtop__${id}__r$r.txt" > /dev/null
    done
  fi
  if has_row prefill; then
    for id in ${PREFILL_SET//,/ }; do
      wanted "$id" || continue
      m=${PATHS[$id]}
      n=509 pp=512
      [[ $id == stories260k ]] && n=253 pp=256
      pf=$OUT/prompt-$id.txt
      [[ -f $pf ]] || make_prompt "$m" "$n" "$pf" > "$OUT/prompt-$id.tokens"
      log "[$r/$REPS] prefill $id"
      "$B/llama-bench" -m "$m" -t "$T" -p "$pp" -n 0 -r 1 -o json > "$OUT/prefill__llama__${id}__r$r.json" 2> /dev/null
      "$K" generate -m "$m" -f "$pf" -n 1 --temp 0 --ignore-eos --stats -t "$T" \
        2> "$OUT/prefill__kvtop__${id}__r$r.txt" > /dev/null
    done
  fi
  if has_row conc && wanted 110m-q8_0; then
    m=${PATHS[110m-q8_0]}
    for fa in on off; do
      log "[$r/$REPS] conc llama.cpp fa $fa"
      "$B/llama-batched-bench" -m "$m" -t "$T" -tb "$T" -c 16640 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32,64 \
        -fa "$fa" > "$OUT/conc__llama__fa-${fa}__r$r.txt" 2> /dev/null
    done
    for c in 32 64; do
      log "[$r/$REPS] conc kvtop $c"
      "$K" bench profiles/bench-concurrency.yaml --set model.path="$m" --set kv.memory=1GiB --set threads="$T" \
        --set workload.concurrency=$c --set workload.requests=$((2 * c)) \
        --json "$OUT/conc__kvtop__c${c}__r$r.json" --quiet
      "$K" bench profiles/bench-concurrency.yaml --set model.path="$m" --set kv.memory=1GiB --set threads="$T" \
        --set workload.concurrency=$c --set workload.requests=$c \
        --json "$OUT/conc__kvtop__wave${c}__r$r.json" --quiet
    done
  fi
  LONG_ID=${LONG_MODEL:-smollm2}
  if has_row long && wanted "$LONG_ID"; then
    m=${PATHS[$LONG_ID]}
    for d in ${LONG_DEPTHS:-2048 8000}; do
      [[ $d =~ ^[1-9][0-9]*$ ]] || { echo "speed_table: LONG_DEPTHS wants token counts" >&2; exit 2; }
      mem=512MiB
      ((d > 12000)) && mem=1GiB
      for kt in f16 q8_0; do
        log "[$r/$REPS] long llama.cpp depth $d kv $kt"
        "$B/llama-bench" -m "$m" -t "$T" -p 0 -n 32 -d "$d" -fa 1 -ctk "$kt" -ctv "$kt" -r 1 -o json \
          > "$OUT/long__llama__d${d}-${kt}__r$r.json" 2> /dev/null
      done
      for kv in f16 int8 fp8_e4m3; do
        log "[$r/$REPS] long kvtop depth $d kv $kv"
        "$K" bench profiles/bench-concurrency.yaml --set model.path="$m" --set kv.memory="$mem" \
          --set threads="$T" --set kv.dtype="$kv" --set workload.concurrency=1 --set workload.requests=1 \
          --set workload.prompt_len="$d" --set workload.output_len=64 --set scheduler.prefill_chunk=512 \
          --json "$OUT/long__kvtop__d${d}-${kv}__r$r.json" --quiet
      done
    done
  fi
done
uptime > "$OUT/uptime-end.txt"
python3 tools/speed_table.py "$OUT" | tee "$OUT/table.md"
