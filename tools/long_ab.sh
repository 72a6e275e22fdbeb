#!/usr/bin/env bash
# long_ab.sh - decode tok/s after a long prompt (1000 / TPOT p50 of one
# request: SmolLM2, kvtop bench, the speed table's `long` row settings) of
# two kvtop binaries, alternating A, B, A, B in one run so that a loaded
# machine's drift lands on both; prints each run and the median of the
# paired B/A ratios. Prefill is not timed (TPOT is the decode steps only).
#
#   tools/long_ab.sh OLD_KVTOP NEW_KVTOP [REPEATS] [DEPTH] [KV_DTYPE] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n 2,8p "$0"; exit 2; }
A=$1 B=$2 REPS=${3:-5} D=${4:-2048} KV=${5:-f16} M=${6:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
T=${THREADS:-2}
J=$(mktemp -d)
trap 'rm -rf "$J"' EXIT
tps() { # binary -> decode tok/s of one run
  "$1" bench profiles/bench-concurrency.yaml --set model.path="$M" --set kv.memory=1GiB --set threads="$T" \
    --set kv.dtype="$KV" --set workload.concurrency=1 --set workload.requests=1 --set workload.prompt_len="$D" \
    --set workload.output_len=64 --set scheduler.prefill_chunk=512 --json "$J/r.json" --quiet > /dev/null
  python3 -c 'import json,sys; print("%.2f" % (1000.0 / json.load(open(sys.argv[1]))["tpot_ms"]["p50"]))' "$J/r.json"
}
echo "$(basename "$M") depth $D kv $KV threads $T, $REPS pairs; load before: $(uptime | sed 's/.*load/load/')"
ra=() rb=() pr=()
for ((r = 0; r < REPS; r++)); do
  ra+=("$(tps "$A")")
  rb+=("$(tps "$B")")
  pr+=("$(awk -v a="${ra[r]}" -v b="${rb[r]}" 'BEGIN{printf "%.4f", b/a}')")
done
med() { sort -g | awk '{v[NR]=$1} END {print NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo "  A runs: ${ra[*]} (median $(printf '%s\n' "${ra[@]}" | med))"
echo "  B runs: ${rb[*]} (median $(printf '%s\n' "${rb[@]}" | med))"
echo "  paired B/A: ${pr[*]}; median $(printf '%s\n' "${pr[@]}" | med)"
echo "  load after: $(uptime | sed 's/.*load/load/')"
