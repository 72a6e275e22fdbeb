#!/usr/bin/env bash
# End-to-end checks of `kvtop eval --tasks` on stories260K (a few seconds):
# a task directory's text is scored like --text, the JSON and code sets
# run per configuration and the table and JSON count passes out of the
# tasks; the first row's answers equal themselves; no temp files are left;
# a bad task file is refused naming file:line (exit 2) and --text with
# --tasks is a usage error. What the scorers accept and reject is unit
# tested (tests/engine/test_eval_tasks.c). Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
M=$S/models/stories260K.gguf
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 600)"; }
if [[ ! -f $M ]]; then echo "  (skipped: $M not present)"; echo "0 passed, 0 failed"; exit 0; fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir "$T/tasks" "$T/tmp"
head -n 3 data/eval/tasks/json.jsonl > "$T/tasks/json.jsonl"
head -n 3 data/eval/tasks/code.jsonl > "$T/tasks/code.jsonl"
head -c 600 data/eval/tasks/welsh.txt > "$T/tasks/welsh.txt"

out=$(TMPDIR="$T/tmp" $K eval -m "$M" --tasks "$T/tasks" --weights f32,q8_0 --kv int8 -t 1 --tmp-dir "$T/tmp" \
      --json "$T/t.json" -q 2>&1); rc=$?
[[ $rc == 0 ]] && ok "eval --tasks runs" || bad "eval --tasks (exit $rc)" "$out"
[[ $out == *"welsh.txt"*"ppl"* ]] && ok "the text set gets the perplexity table" || bad "text table" "$out"
[[ $out == *"json pass"*"code pass"* && $out == *"q8_0"* && $out == *"int8"* ]] && ok "task table rows" \
  || bad "task table" "$out"
python3 - "$T/t.json" <<'PY' && ok "JSON: 3 rows, passes counted out of 3 tasks per set" || bad "JSON" "$(cat "$T/t.json")"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["rows"]
assert [x["weights"] for x in r] == ["f32", "q8_0", "f32"] and [x["kv"] for x in r] == ["f16", "f16", "int8"]
for x in r:
    for k in ("json", "code"):
        assert x[k]["n"] == 3 and 0 <= x[k]["pass"] <= 3 and 0 <= x[k]["same_as_first_row"] <= 3
assert r[0]["json"]["same_as_first_row"] == 3 and r[0]["code"]["same_as_first_row"] == 3
PY
[[ -z $(ls -A "$T/tmp") ]] && ok "no temp files left" || bad "temp files left" "$(ls -A "$T/tmp")"

printf '{"id": "x", "prompt": "p", "tests": "assert 1"}\n{"id": "y"}\n' > "$T/tasks/code.jsonl"
out=$($K eval -m "$M" --tasks "$T/tasks" --weights none --kv f16 -q 2>&1); rc=$?
[[ $rc == 2 && $out == *"code.jsonl:2"*"prompt"* ]] && ok "bad task file: exit 2 naming file:line" || bad "bad task file (exit $rc)" "$out"
out=$($K eval -m "$M" --tasks "$T/tasks" --text data/eval/tasks/welsh.txt 2>&1); rc=$?
[[ $rc == 2 && $out == *"not both"* ]] && ok "--text with --tasks refused" || bad "--text with --tasks (exit $rc)" "$out"
out=$($K eval -m "$M" --tasks "$T/none" 2>&1); rc=$?
[[ $rc == 2 && $out == *"$T/none"* ]] && ok "missing task directory refused" || bad "missing dir (exit $rc)" "$out"
$K eval --help | grep -q -- "--tasks DIR" && ok "--help lists --tasks" || bad "--help"
echo "$pass passed, $fail failed"
(( fail == 0 ))
