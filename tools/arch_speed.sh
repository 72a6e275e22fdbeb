#!/usr/bin/env bash
# arch_speed.sh - the README's Gemma 3 270M speed figures, kvtop and
# llama.cpp side by side in one run, 2 threads each, one after the other:
#   single-stream decode: llama-bench tg64 vs kvtop 1000 / median TPOT of 4
#     requests run one at a time (128-token prompts, 64 output tokens)
#   single-stream prefill: llama-bench pp128 vs kvtop 128 / median TTFT
#   32 concurrent: llama-batched-bench -npl 32 (S_TG, aggregate decode
#     tok/s) vs kvtop's output tok/s with 32 requests in flight (closed
#     loop, 64 requests, 128 + 64 tokens each, prefill included) and vs
#     kvtop's decode_step_tokens_per_s of one wave of 32 requests sent at
#     once (prefill left out, as S_TG: the like-for-like figure)
#
#   bash tools/arch_speed.sh [MODEL]   (default models/gemma-3-270m-Q4_K_M.gguf)
#
# Needs `make`, `make models` and a llama.cpp build at $KVTOP_LLAMA_DIR or
# build/llama.cpp (as tests/e2e/arch_oracle.sh). Outputs go to
# build/arch-speed. Compare within one run: the machine may be shared.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KVTOP_BIN:-./kvtop}
M=${1:-models/gemma-3-270m-Q4_K_M.gguf}
LL=${KVTOP_LLAMA_DIR:-build/llama.cpp}
B=$LL/build/bin
OUT=build/arch-speed
mkdir -p "$OUT"
[[ -x $K && -f $M ]] || { echo "arch_speed: needs $K and $M (make && make models)" >&2; exit 1; }
[[ -x $B/llama-bench ]] || { echo "arch_speed: no llama.cpp build at $LL" >&2; exit 1; }
export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

"$B/llama-bench" -m "$M" -t 2 -p 128 -n 64 -r 3 -o json >"$OUT/llama-bench.json" 2>"$OUT/llama-bench.log"
"$B/llama-batched-bench" -m "$M" -t 2 -tb 2 -c 8192 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,32 \
    >"$OUT/llama-batched.txt" 2>"$OUT/llama-batched.log"
run_kvtop() { # NAME CONCURRENCY REQUESTS
    $K bench profiles/bench-concurrency.yaml --set model.path="$M" --set kv.memory=1GiB --set threads=2 \
        --set workload.concurrency="$2" --set workload.requests="$3" --set workload.output_len=64 \
        --json "$OUT/kvtop-$1.json" --quiet
}
run_kvtop c1 1 4
run_kvtop c32 32 64
run_kvtop wave32 32 32

python3 - "$OUT" "$M" <<'EOF'
import json, re, sys
out, model = sys.argv[1], sys.argv[2]
lb = json.load(open(f"{out}/llama-bench.json"))
pp = next(r['avg_ts'] for r in lb if r['n_prompt'] > 0 and r['n_gen'] == 0)
tg = next(r['avg_ts'] for r in lb if r['n_gen'] > 0 and r['n_prompt'] == 0)
s_tg = {}
for line in open(f"{out}/llama-batched.txt"):
    cells = [c.strip() for c in line.split('|')]
    if len(cells) > 9 and re.fullmatch(r'\d+', cells[3] or 'x'):
        s_tg[int(cells[3])] = float(cells[8])  # |PP|TG|B|N_KV|T_PP|S_PP|T_TG|S_TG|...
k1 = json.load(open(f"{out}/kvtop-c1.json"))
k32 = json.load(open(f"{out}/kvtop-c32.json"))
dec1 = 1000.0 / k1['tpot_ms']['p50']
pre1 = 128 * 1000.0 / k1['ttft_ms']['p50']
agg = k32['output_tokens_per_s']
wave = json.load(open(f"{out}/kvtop-wave32.json")).get('decode_step_tokens_per_s', float('nan'))
print(f"{model}, 2 threads, one run:\n")
print("| figure | kvtop | llama.cpp | kvtop / llama.cpp |")
print("|---|---|---|---|")
print(f"| decode, 1 stream (tok/s) | {dec1:.1f} | {tg:.1f} (llama-bench tg64) | {dec1 / tg:.2f}x |")
print(f"| prefill, 1 stream (tok/s) | {pre1:.0f} | {pp:.0f} (llama-bench pp128) | {pre1 / pp:.2f}x |")
best = max(s_tg.values()) if s_tg else float('nan')
print(f"| decode, 32 concurrent (tok/s) | {agg:.0f} | {s_tg.get(32, float('nan')):.0f} (batched-bench S_TG at 32; "
      f"best of 1, 32: {best:.0f}) | {agg / best:.2f}x of its best |")
print(f"| decode, 32 concurrent, decode steps only (tok/s) | {wave:.0f} (one wave of 32) | {s_tg.get(32, float('nan')):.0f} "
      f"(S_TG at 32) | {wave / s_tg.get(32, float('nan')):.2f}x |")
EOF
