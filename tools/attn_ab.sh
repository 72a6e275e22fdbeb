#!/usr/bin/env bash
# attn_ab.sh - the paged attention of revision REV against the working
# tree's, timed alternately in one process (tools/attn_ab/attn_ab.c: one
# decode token of each of 64 sequences by default, the 64-concurrent step's
# attention). REV's kernels/cpu_attention.c and its ISA files are compiled
# here with their symbols renamed base_*, the rest links from
# build/libkvkernels.a (run `make` first). Arguments after REV go to the
# harness.
#
#   tools/attn_ab.sh REV [--batch N] [--ctx LO:HI] [--threads T] [--reps R] [--shared] [--dtype D]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { sed -n 2,9p "$0"; exit 2; }
REV=$1
shift
B=build/attn_ab
mkdir -p "$B"
CC=${CC:-cc}
F=(-std=c11 -D_GNU_SOURCE -O2 -pthread -Ikernels -Ibase)
for f in cpu_attention.c cpu_attention_avx2.c cpu_attention_avx512.c cpu_attention_isa.h; do
  git show "$REV:kernels/$f" > "$B/$f"
done
for f in cpu_attention cpu_attention_avx2 cpu_attention_avx512; do
  $CC "${F[@]}" -c -o "$B/$f.o" "$B/$f.c"
done
nm -g --defined-only "$B"/cpu_attention*.o | awk 'NF == 3 {print $3 " base_" $3}' | sort -u > "$B/syms"
for f in cpu_attention cpu_attention_avx2 cpu_attention_avx512; do
  objcopy --redefine-syms="$B/syms" "$B/$f.o" "$B/$f.base.o"
done
$CC "${F[@]}" -o "$B/attn_ab" tools/attn_ab/attn_ab.c "$B"/cpu_attention*.base.o build/libkvkernels.a \
  build/libkvbase.a -lm -lpthread
echo "load before: $(uptime | sed 's/.*load/load/')"
"$B/attn_ab" "$@"
echo "load after: $(uptime | sed 's/.*load/load/')"
