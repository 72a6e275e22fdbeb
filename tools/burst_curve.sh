#!/usr/bin/env bash
# burst_curve.sh - how `kvtop bench` scales with the size of a burst: N
# tiny requests (4 prompt tokens, 1 output token, greedy) submitted at once
# on stories260K, one thread, for each N. Prints a Markdown table: the
# bench's wall time (first submission to last request done), the whole
# process's wall and CPU time (model load and tokenizing every prompt
# included; CPU time is the figure to compare on a shared machine), CPU
# time per request, the peak RSS and the engine steps. A step's cost should
# not grow with the queue behind it, so the time per request stays flat.
#
#   bash tools/burst_curve.sh [N ...]        (default 10000 20000 40000 100000 1000000)
#
# Environment: KVTOP_BIN (default ./kvtop), KVTOP_SHARED (default ../shared),
# TIMEOUT seconds per run (default 900; a run past it shows "timeout"),
# MAX_SEQS (default 16, the default profile's). Needs GNU time
# (/usr/bin/time) for the RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
M=$S/models/stories260K.gguf
TIMEOUT=${TIMEOUT:-900}
MAX_SEQS=${MAX_SEQS:-16}
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(10000 20000 40000 100000 1000000)
[[ -x $K ]] || { echo "burst_curve: no kvtop at $K (make, or set KVTOP_BIN)" >&2; exit 2; }
[[ -f $M ]] || { echo "burst_curve: $M missing (set KVTOP_SHARED)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "burst_curve: needs GNU time (/usr/bin/time)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "| requests | bench wall s | process wall s | process CPU s | CPU µs / request | peak RSS MiB | engine steps |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
  rc=0
  timeout "$TIMEOUT" /usr/bin/time -f "%e %M %U %S" -o "$tmp/time" "$K" bench profiles/default.yaml \
    --set model.path="$M" --set threads=1 --set workload.requests="$n" --set workload.arrival=burst \
    --set workload.prompt_len=4 --set workload.output_len=1 --set workload.ignore_eos=true \
    --set sampling.temperature=0 --set spec.method=off --set kv.prefix_sharing=false --set kv.memory=4MiB \
    --set scheduler.max_seqs="$MAX_SEQS" --json "$tmp/b.json" --quiet >/dev/null 2>"$tmp/err" || rc=$?
  if [[ $rc == 124 ]]; then
    echo "| $n | timeout (> $TIMEOUT s) | | | | | |"
    continue
  fi
  if [[ $rc != 0 ]]; then
    echo "| $n | failed (exit $rc): $(head -c 200 "$tmp/err" | tr '\n|' '  ') | | | | | |"
    continue
  fi
  read -r total rss_kb user sys <"$tmp/time"
  python3 - "$tmp/b.json" "$n" "$total" "$rss_kb" "$user" "$sys" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
n, total, rss = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
cpu = float(sys.argv[5]) + float(sys.argv[6])
assert d["requests_completed"] == n, d["requests_completed"]
print(f"| {n} | {d['wall_s']:.2f} | {total:.2f} | {cpu:.2f} | {1e6 * cpu / n:.0f} | {rss / 1024:.0f} | {d['steps']} |")
EOF
done
