#!/usr/bin/env bash
# quant_figures.sh - the quantization figures of the README in one run:
# for each weight type x KV dtype, weight memory, KV bytes per token, the
# sequences that fit in one fixed memory budget (weights + activations + KV,
# `memory.budget`), single-stream decode tok/s (1000 / median TPOT of 4
# requests run one at a time), aggregate output tok/s at 32
# concurrent requests, and the accuracy price from `kvtop eval --grid`.
#
#   bash tools/quant_figures.sh [110m|smollm2|all]   (default all)
#
# Needs `make`, `make models` and `make bench-models`. Weight variants of
# SmolLM2 are re-encoded from its Q4_1 file with `kvtop quantize` into
# models/ (the only copy available is Q4_1, so its "f32" is those values in
# f32). Every figure of one model comes from this one run: compare within a
# table, not across runs. Environment: BUDGET_110M (default 768MiB),
# BUDGET_SMOLLM2 (default 640MiB: f32 weights leave room for ~14 requests), SEQ_TOKENS
# (default 256: prompt 128 + output 128, the requests of the runs), REQUESTS
# (default 64), KVS (default "f16 int8 fp8_e4m3"), KVTOP_BIN (default ./kvtop).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KVTOP_BIN:-./kvtop}
BUDGET_110M=${BUDGET_110M:-768MiB}
BUDGET_SMOLLM2=${BUDGET_SMOLLM2:-640MiB}
SEQ_TOKENS=${SEQ_TOKENS:-256}
REQUESTS=${REQUESTS:-64}
KVS=${KVS:-"f16 int8 fp8_e4m3"}
TEXT=data/eval/kvtop-eval.txt
OUT=${OUT:-build/quant-figures}
which=${1:-all}
mkdir -p "$OUT"
[[ -x $K ]] || { echo "quant_figures: build kvtop first (make)" >&2; exit 1; }

# bench NAME MODEL KV CONCURRENCY REQUESTS: one closed-loop run of
# bench-concurrency.yaml (128-token prompts, 128 output tokens) in the budget.
bench() {
    local name=$1 model=$2 kv=$3 conc=$4 nreq=$5
    $K bench profiles/bench-concurrency.yaml --set model.path="$model" --set kv.dtype="$kv" \
        --set memory.budget="$BUDGET" --set workload.concurrency="$conc" --set workload.requests="$nreq" \
        --set scheduler.max_seqs=64 --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1 ||
        { echo "quant_figures: bench $name failed: $(tail -n 1 "$OUT/$name.log")" >&2; return 1; }
}

# figures LABEL EVAL_MODEL "TYPE=FILE ..." : runs everything for one model
# and prints its markdown table.
figures() {
    local label=$1 eval_model=$2; shift 2
    local types=() t
    for t in "$@"; do types+=("${t%%=*}"); done
    echo "== $label: eval --grid" >&2
    $K eval -m "$eval_model" --text $TEXT --grid --weights "$(IFS=,; echo "${types[*]}")" \
        --kv "$(echo $KVS | tr ' ' ,)" -q --json "$OUT/$label-eval.json" >"$OUT/$label-eval.txt"
    for t in "$@"; do
        local ty=${t%%=*} file=${t#*=} kv
        for kv in $KVS; do
            echo "== $label: $ty weights, $kv KV" >&2
            bench "$label-$ty-$kv-c1" "$file" "$kv" 1 4
            bench "$label-$ty-$kv-c32" "$file" "$kv" 32 "$REQUESTS"
        done
    done
    python3 - "$OUT" "$label" "$SEQ_TOKENS" "$BUDGET" "$KVS" "$@" <<'EOF'
import json, math, sys
out, label, seq, budget, kvs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5].split()
types = [a.split('=', 1)[0] for a in sys.argv[6:]]
ev = json.load(open(f"{out}/{label}-eval.json"))
rows = {(r['weights'], r['kv']): r for r in ev['rows'] if not r['reference']}
ref = next(r for r in ev['rows'] if r['reference'])
def mib(b): return f"{b / 1048576:.1f} MiB"
def kib(b): return f"{b / 1024:.2f} KiB".replace('.00 ', ' ')
print(f"{label}: budget {budget} for weights + activations + KV; sequences of {seq} tokens; "
      f"eval: {ev['predictions']} predictions, reference f32 weights + f32 KV (ppl {ref['ppl']:.3f})\n")
print("| weights | KV | weight memory | KV per token | KV blocks in budget | sequences that fit | "
      "decode tok/s, 1 stream | output tok/s, 32 concurrent | running at once (of 32) | ppl | mean KL | top-1 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
base1 = base32 = None
for ty in types:
    for kv in kvs:
        b1 = json.load(open(f"{out}/{label}-{ty}-{kv}-c1.json"))
        b32 = json.load(open(f"{out}/{label}-{ty}-{kv}-c32.json"))
        e = rows.get((ty, kv))
        bs = b32['kv_block_size']
        fit = b32['kv_blocks_total'] // math.ceil(seq / bs)
        one = 1000.0 / b1['tpot_ms']['p50']
        agg = b32['output_tokens_per_s']
        if base1 is None: base1, base32, basefit = one, agg, fit
        print(f"| {ty} | {kv} | {mib(b32['memory']['weights'])} | {kib(b32['kv_bytes_per_token'])} | "
              f"{b32['kv_blocks_total']} | {fit} ({fit / basefit:.1f}x) | {one:.0f} ({one / base1:.2f}x) | "
              f"{agg:.0f} ({agg / base32:.2f}x) | {b32['max_concurrent']}"
              + (f", {b32['preemptions']} preempted | " if b32['preemptions'] else " | ")
              + (f"{e['ppl']:.3f} | {e['mean_kl']:.2g} | {100 * e['top1_agreement']:.1f}% |" if e else "- | - | - |"))
print()
EOF
}

if [[ $which == all || $which == 110m ]]; then
    for t in f32 q8_0 q4_0; do
        [[ -f models/rand-110m-$t.gguf ]] || { echo "quant_figures: run make bench-models" >&2; exit 1; }
    done
    # The eval reference is the f32 file; the other types are re-encoded from it (same as the files).
    BUDGET=$BUDGET_110M figures 110m models/rand-110m-f32.gguf f32=models/rand-110m-f32.gguf q8_0=models/rand-110m-q8_0.gguf \
        q4_0=models/rand-110m-q4_0.gguf
fi
if [[ $which == all || $which == smollm2 ]]; then
    src=models/SmolLM2-135M-Instruct.Q4_1.gguf
    [[ -f $src ]] || { echo "quant_figures: run make models" >&2; exit 1; }
    for t in f32 q8_0 q4_0; do
        f=models/smollm2-135m-$t.gguf
        [[ -f $f ]] || $K quantize "$src" "$f" $t >/dev/null
    done
    BUDGET=$BUDGET_SMOLLM2 figures smollm2 $src f32=models/smollm2-135m-f32.gguf q8_0=models/smollm2-135m-q8_0.gguf \
        q4_0=models/smollm2-135m-q4_0.gguf q4_1=$src
fi
