#!/usr/bin/env bash
# kvtop tokenize against llama.cpp's vocabulary test sets: for every
# models/ggml-vocab-SET.gguf with .inp/.out files in the llama.cpp that the
# llama-cpp-python sdist vendors (tools/vocab_fetch.sh fetches it once into
# build/, or uses a copy already on the machine), every string must give
# exactly the reference ids (`kvtop tokenize -m SET.gguf --no-bos -f FILE`,
# all strings of a set in one process: vocab_score.py --fast; without --fast
# it runs one process per string, as the acceptance check does). One check
# per set.
# Offline with no copy: says so and counts a skip.
# Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 1500)"; }
if ! dir=$(bash tools/vocab_fetch.sh 2>&1); then
  echo "  skipped: llama.cpp vocab test sets unavailable ($dir)"
  echo "$pass passed, $fail failed"
  exit 0
fi
out=$(python3 tools/vocab_score.py "$dir" --kvtop "$K" --fast -v 2>&1)
rows=$(echo "$out" | grep -E '^\| [a-z0-9-]+ \| [0-9]+ \| ' | grep -v '^| set ')
[[ -n $rows ]] || bad "vocab_score.py printed no sets" "$out"
while read -r line; do
  [[ -n $line ]] || continue
  set_=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$2); print $2}')
  n=$(echo "$line" | awk -F'|' '{gsub(/ /,"",$3); print $3}')
  got=$(echo "$line" | awk -F'|' '{print $4}' | grep -oE '[0-9]+' | head -1)
  if [[ $got == "$n" ]]; then ok "$set_: $n/$n strings exact"
  else bad "$set_: $got/$n strings exact" "$(echo "$out" | grep -A2 "^\[$set_\]" | head -12)"; fi
done <<< "$rows"
echo "$pass passed, $fail failed"
