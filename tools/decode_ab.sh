#!/usr/bin/env bash
# decode_ab.sh - single-stream decode tok/s of two kvtop binaries, alternating
# in one run (A, B, A, B, ...), so that a loaded machine's drift lands on
# both: per model the median and min-max of each, their ratio, and the
# median of the paired ratios (each A run with the B run right after it). For a
# change's before/after, build the old commit elsewhere and pass its binary.
#
#   tools/decode_ab.sh OLD_KVTOP NEW_KVTOP [REPEATS] [TOKENS] [MODEL...]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n 2,8p "$0"; exit 2; }
A=$1 B=$2
REPS=${3:-7}
N=${4:-128}
shift $(( $# >= 4 ? 4 : $# ))
MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/rand-110m-q8_0.gguf)
T=${THREADS:-2}
tps() { # binary model -> decode tok/s of one run
  "$1" generate -m "$2" -p "hello world" -n "$N" --temp 0 --ignore-eos --stats -t "$T" 2>&1 > /dev/null |
    awk '/^decode +[0-9]/{for (i = 1; i <= NF; i++) if ($i == "tok/s") print $(i-1)}'
}
stats() { # [printf format] < values -> "median (min-max)"
  sort -g | awk -v f="${1:-%.1f}" '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf f " (" f "-" f ")", m, v[1], v[NR]}'
}
echo "threads $T, $REPS repeats of $N tokens, alternating; load before: $(uptime | sed 's/.*load/load/')"
for m in "${MODELS[@]}"; do
  ra=() rb=()
  for ((r = 0; r < REPS; r++)); do
    ra+=("$(tps "$A" "$m")")
    rb+=("$(tps "$B" "$m")")
  done
  sa=$(printf '%s\n' "${ra[@]}" | stats) sb=$(printf '%s\n' "${rb[@]}" | stats)
  ma=${sa%% *} mb=${sb%% *}
  echo "$(basename "$m"): A $sa tok/s, B $sb tok/s, B/A $(awk -v a="$ma" -v b="$mb" 'BEGIN{printf "%.3f", b/a}')"
  pr=$(for ((r = 0; r < REPS; r++)); do awk -v a="${ra[r]}" -v b="${rb[r]}" 'BEGIN{printf "%.4f\n", b/a}'; done | stats %.3f)
  wins=$(for ((r = 0; r < REPS; r++)); do awk -v a="${ra[r]}" -v b="${rb[r]}" 'BEGIN{print (b > a)}'; done | grep -c 1 || true)
  echo "  paired B/A (each A run with the B run after it): median $pr; B faster in $wins of $REPS pairs"
  echo "  A runs: ${ra[*]}"
  echo "  B runs: ${rb[*]}"
done
echo "load after: $(uptime | sed 's/.*load/load/')"
