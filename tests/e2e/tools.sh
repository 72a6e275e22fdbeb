#!/usr/bin/env bash
# The tools/ that make the README's figures and the generated tables do not
# rot: spec_figures (built by `make`) runs on stories260K with every method,
# keeps greedy outputs equal to speculation off and writes a usable draft;
# the table generators reproduce the committed tables (when this Python can);
# every script parses and every repository path the tools name exists.
# Prints "N passed, N failed".
set -u
BUILD=${BUILD:-build}
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
M=$S/models/stories260K.gguf
SF=$BUILD/tools/spec_figures
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 600)"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- spec_figures ----
if [[ -x $SF ]]; then
  ok "make builds $SF"
  out=$($SF 2>&1); rc=$?
  [[ $rc == 2 && $out == *usage:* ]] && ok "spec_figures without options: usage, exit 2" || bad "spec_figures usage" "$out"
  out=$($SF --model "$M" --make-draft 2 "$tmp/draft.gguf" 2>&1); rc=$?
  info=$($K info "$tmp/draft.gguf" 2>&1)
  [[ $rc == 0 && $info =~ layers\ +2 ]] && ok "--make-draft 2 writes a 2-layer model" || bad "--make-draft" "$out $info"
  out=$($SF --model "$M" --make-draft 9 "$tmp/d9.gguf" 2>&1); rc=$?
  [[ $rc == 1 && $out == *"has 5"* && ! -e $tmp/d9.gguf ]] && ok "--make-draft past the model's layers: error, no file" \
    || bad "--make-draft 9" "$out"
  out=$($SF --model "$M" --prompts data/spec/repetitive.jsonl --methods off,ngram,self,draft_model \
        --draft "$tmp/draft.gguf" --kmax 2 --layers 2 --requests 2 --out 8 --reps 1 --threads 1 2>&1); rc=$?
  rows=$(echo "$out" | grep -cE '^\| (ngram|self L2|draft_model) \| [12] \|')
  [[ $rc == 0 && $rows == 6 ]] && ok "a tiny run prints a row per method and k" || bad "spec_figures rows ($rows)" "$out"
  [[ $rc == 0 && $(echo "$out" | grep -c '| same |$') == 6 ]] && ok "greedy outputs match speculation off" \
    || bad "spec_figures outputs" "$out"
else
  bad "make builds $SF (run make test-build)"
fi

# ---- generated tables ----
want=$(sed -n 's/.*unicodedata (Unicode \([0-9.]*\)).*/\1/p' engine/unicode_tables.h)
have=$(python3 -c 'import unicodedata; print(unicodedata.unidata_version)' 2>/dev/null)
if [[ -n $have && $have == "$want" ]]; then
  out=$(python3 tools/gen_unicode_tables.py "$tmp/unicode_tables.h" 2>&1)
  cmp -s "$tmp/unicode_tables.h" engine/unicode_tables.h && ok "gen_unicode_tables.py reproduces engine/unicode_tables.h" \
    || bad "gen_unicode_tables.py output differs" "$out"
else
  echo "  skipped: this Python has Unicode ${have:-none}, the table $want"
fi
if python3 -c 'import regex' 2>/dev/null; then
  python3 tools/gen_split_cases.py > "$tmp/splits.tsv" 2>&1 && cmp -s "$tmp/splits.tsv" tests/fixtures/tokenizer_splits.tsv \
    && ok "gen_split_cases.py reproduces tests/fixtures/tokenizer_splits.tsv" || bad "gen_split_cases.py output differs"
else
  echo "  skipped: gen_split_cases.py needs Python's regex module"
fi

# ---- every script parses; every path the tools name exists ----
for f in tools/*.sh; do
  bash -n "$f" 2>"$tmp/err" && ok "$f parses" || bad "$f parses" "$(cat "$tmp/err")"
done
for f in tools/*.py; do
  python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])' "$f" 2>"$tmp/err" \
    && ok "$f parses" || bad "$f parses" "$(cat "$tmp/err")"
done
missing=
# (build outputs such as build/tools/spec_figures are not in the tree)
for p in $(sed -E 's#[A-Za-z0-9_.-]*build[A-Za-z0-9_-]*/[A-Za-z0-9_./-]*##g' $(find tools -type f) |
           grep -oE '\b(base|kernels|engine|profiles|cli|tui|tests|data|tools)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' | sort -u); do
  [[ -e $p ]] || missing="$missing $p"
done
[[ -z $missing ]] && ok "every repository path named in tools/ exists" || bad "paths named in tools/ missing:$missing"

echo "$pass passed, $fail failed"
