#!/usr/bin/env bash
# Runs every test program (build/tests/*/*) and every end-to-end script
# (tests/e2e/*.sh), each of which ends with "N passed, N failed", and prints
# the sum as the last line. Exits non-zero when anything failed.
set -u
BUILD=${BUILD:-build}
export KVTOP_BIN=${KVTOP_BIN:-./kvtop}
export KVTOP_SHARED=${KVTOP_SHARED:-../shared}
total_p=0 total_f=0
run_one() {
  local name=$1; shift
  local out rc
  echo "== $name"
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^  ok ' | sed -e '/^[0-9]* passed, [0-9]* failed$/d'
  local line p f
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}
  else
    p=0 f=1; echo "FAIL $name: no result line (exit $rc)"
  fi
  if (( rc != 0 && f == 0 )); then f=1; echo "FAIL $name: exit $rc"; fi
  echo "   $p passed, $f failed"
  total_p=$((total_p + p)); total_f=$((total_f + f))
}
for t in $(find "$BUILD/tests" -type f -perm -u+x | sort); do
  run_one "${t#$BUILD/tests/}" "$t"
done
for s in tests/e2e/*.sh; do
  [[ -f $s ]] || continue
  run_one "$s" bash "$s"
done
echo "$total_p passed, $total_f failed"
(( total_f == 0 ))
