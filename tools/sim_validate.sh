#!/usr/bin/env bash
# sim_validate.sh - kvtop's synthetic models against published measurements:
# runs each configuration on the sim backend and prints config, published
# figure, kvtop's prediction and the error, then the median absolute error.
#   bash tools/sim_validate.sh [KVTOP_BIN]
# Sources (output tokens per second):
#   [T] NVIDIA TensorRT-LLM release/0.5.0 docs/source/performance.md, "High
#       Throughput", H100 GPUs (FP8), static batching.
#   [L] InternLM lmdeploy docs/en/benchmark/a100_fp16.md (v0.2.0), A100-80G,
#       llama2-7b fp16, batch 1, 1 prompt token, 128 output tokens.
set -u
KVTOP=${1:-./kvtop}
run() { # NAME PUBLISHED SRC ARGS...
  local name=$1 pub=$2 src=$3; shift 3
  local out tmp
  tmp=$(mktemp)
  out=$("$KVTOP" bench profiles/sim-validate.yaml --json "$tmp" "$@" >/dev/null 2>&1 &&
        python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["sim_output_tokens_per_s"])' "$tmp")
  rm -f "$tmp"
  [[ -n $out ]] || out=0
  python3 - "$name" "$pub" "$out" "$src" <<'PY'
import sys
name, pub, got, src = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
err = (got - pub) / pub * 100
print(f"| {name} | {pub:,.0f} {src} | {got:,.0f} | {err:+.1f}% |")
PY
}
echo "| configuration | published out tok/s | kvtop | error |"
echo "|---|---|---|---|"
{
static64() { echo --set scheduler.policy=static --set scheduler.max_seqs=64 --set workload.requests=64 --set workload.arrival=burst; }
run "llama-2-7b FP8, 1 x H100, batch 64, 128 in / 128 out" 9193 "[T]" --set model.synthetic=llama-2-7b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm $(static64) --set workload.prompt_len=128 --set workload.output_len=128
run "llama-2-7b FP8, 1 x H100, batch 64, 128 in / 2048 out" 5367 "[T]" --set model.synthetic=llama-2-7b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm $(static64) --set workload.prompt_len=128 --set workload.output_len=2048
run "llama-2-7b FP8, 1 x H100, batch 64, 2048 in / 128 out" 2058 "[T]" --set model.synthetic=llama-2-7b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm $(static64) --set workload.prompt_len=2048 --set workload.output_len=128
run "llama-2-70b FP8, 4 x H100 TP4, batch 64, 128 in / 128 out" 3317 "[T]" --set model.synthetic=llama-2-70b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm --set sim.tp=4 $(static64) --set workload.prompt_len=128 --set workload.output_len=128
run "llama-2-70b FP8, 4 x H100 TP4, batch 64, 128 in / 2048 out" 2616 "[T]" --set model.synthetic=llama-2-70b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm --set sim.tp=4 $(static64) --set workload.prompt_len=128 --set workload.output_len=2048
run "llama-2-70b FP8, 4 x H100 TP4, batch 64, 2048 in / 128 out" 843 "[T]" --set model.synthetic=llama-2-70b --set model.dtype=fp8 --set kv.dtype=fp8_e4m3 --set sim_device=h100-sxm --set sim.tp=4 $(static64) --set workload.prompt_len=2048 --set workload.output_len=128
run "llama-2-7b fp16, 1 x A100-80G, batch 1, 1 in / 128 out" 100.02 "[L]" --set model.synthetic=llama-2-7b --set model.dtype=fp16 --set sim_device=a100-80g --set scheduler.max_seqs=1 --set workload.requests=1 --set workload.arrival=burst --set workload.prompt_len=1 --set workload.output_len=128
} | tee /tmp/sim_validate.$$
python3 - /tmp/sim_validate.$$ <<'PY'
import sys, statistics
errs = [abs(float(l.rsplit("|", 2)[1].strip().rstrip("%"))) for l in open(sys.argv[1]) if l.startswith("| ") and "%" in l]
print(f"\nmedian absolute error {statistics.median(errs):.1f}% over {len(errs)} measurements")
PY
rm -f /tmp/sim_validate.$$
