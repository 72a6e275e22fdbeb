#!/usr/bin/env bash
# kernels_ab.sh - `kvtop bench-kernels` of two kvtop binaries, alternating
# in one run (A, B, A, B, ...) so that a loaded machine's drift lands on
# both: per (shape, type, n) the median GB/s and GFLOP/s of each over the
# repeats, the paired median ratio B/A, and the medians of the read
# bandwidth each run measured (the ceiling of the n = 1 rows).
#
#   tools/kernels_ab.sh OLD_KVTOP NEW_KVTOP [REPEATS] [TYPES] [NS] [THREADS]
#   (defaults: 5 repeats, q4_k,q6_k,q5_0, n = 1,32, 1 thread; ISA=avx2 forces
#   that kernel level in both)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n 2,10p "$0"; exit 2; }
A=$1 B=$2
REPS=${3:-5}
TYPES=${4:-q4_k,q6_k,q5_0}
NS=${5:-1,32}
T=${6:-1}
ISAF=()
[[ -n ${ISA:-} ]] && ISAF=(--isa "$ISA")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "threads $T, $REPS repeats, types $TYPES, n $NS, isa ${ISA:-best}, alternating; load before: $(uptime | sed 's/.*load/load/')"
for ((r = 0; r < REPS; r++)); do
  "$A" bench-kernels -t "$T" --types "$TYPES" --n "$NS" --no-ref --min-time 0.2 "${ISAF[@]}" >"$OUT/a$r.txt"
  "$B" bench-kernels -t "$T" --types "$TYPES" --n "$NS" --no-ref --min-time 0.2 "${ISAF[@]}" >"$OUT/b$r.txt"
done
python3 - "$OUT" "$REPS" <<'EOF'
import re, statistics as st, sys
out, reps = sys.argv[1], int(sys.argv[2])
row = re.compile(r"^(.{13}) (\d+x\d+)\s+(\S+)\s+(\d+)\s+[\d.]+ us\s+([\d.]+)\s+\d+%\s+([\d.]+)")
def parse(path):
    bw, rows = None, {}
    for line in open(path):
        m = re.match(r"memory read bandwidth: ([\d.]+) GB/s", line)
        if m: bw = float(m.group(1))
        m = row.match(line)
        if m: rows[(m.group(1).strip(), m.group(2), m.group(3), int(m.group(4)))] = (float(m.group(5)), float(m.group(6)))
    return bw, rows
A = [parse(f"{out}/a{r}.txt") for r in range(reps)]
B = [parse(f"{out}/b{r}.txt") for r in range(reps)]
print(f"read bandwidth (GB/s, median of the runs): A {st.median(a[0] for a in A):.1f}, B {st.median(b[0] for b in B):.1f}")
print(f"{'shape':<13} {'MxK':<11} {'type':<5} {'n':>4} {'A GB/s':>7} {'B GB/s':>7} {'A GF/s':>7} {'B GF/s':>7} {'B/A paired':>10}")
for k in A[0][1]:
    a = [x[1][k] for x in A if k in x[1]]; b = [x[1][k] for x in B if k in x[1]]
    pr = st.median(bb[1] / aa[1] for aa, bb in zip(a, b))
    print(f"{k[0]:<13} {k[1]:<11} {k[2]:<5} {k[3]:>4} {st.median(x[0] for x in a):7.1f} {st.median(x[0] for x in b):7.1f}"
          f" {st.median(x[1] for x in a):7.1f} {st.median(x[1] for x in b):7.1f} {pr:10.2f}")
EOF
echo "load after: $(uptime | sed 's/.*load/load/')"
