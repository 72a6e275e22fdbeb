#!/usr/bin/env bash
# End-to-end checks of `kvtop eval` on stories260K and the shipped text: the
# f32 configuration matches the f32 reference exactly, q8_0 is close, q4_0
# is further, perplexities are sane, temp files go away, and bad input gets
# clear errors with the right exit status. Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
M=$S/models/stories260K.gguf
TEXT=data/eval/kvtop-eval.txt
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 600)"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/variants"

out=$($K eval -m "$M" --text $TEXT --weights f32,q8_0,q4_0 --kv f32,f16 -t 1 --tmp-dir "$tmp/variants" \
      --json "$tmp/ev.json" -q 2>&1); rc=$?
[[ $rc == 0 && $out == *"predictions"* && $out == *"f32 (ref)"* && $out == *q8_0* && $out == *q4_0* ]] \
  && ok "eval runs and prints the table" || bad "eval runs and prints the table" "$out"
[[ -z $(ls -A "$tmp/variants") ]] && ok "re-encoded variants removed" || bad "re-encoded variants removed" "$(ls -A "$tmp/variants")"

# One line per row from the JSON: weights kv reference ppl mean_kl top1 max_abs_err
rows=$(awk '
  { line = $0; gsub(/[",]/, "", line); split(line, f, ": *"); key = f[1]; gsub(/ /, "", key); val = f[2] }
  key == "weights" { w = val } key == "reference" { r = val } key == "kv" { kv = val }
  key == "ppl" { p = val } key == "mean_kl" { kl = val } key == "top1_agreement" { t = val }
  key == "max_abs_logit_err" { print w, kv, r, p, kl, t, val }' "$tmp/ev.json" 2>/dev/null)
row() { echo "$rows" | awk -v w="$1" -v kv="$2" -v r="$3" '$1 == w && $2 == kv && $3 == r'; }
[[ $(echo "$rows" | wc -l) == 5 ]] && ok "five rows (ref, f32/f16, q8_0, q4_0, f32/f32)" || bad "five rows" "$rows"

r=$(row f32 f32 false)
echo "$r" | awk '{ exit !($5 == 0 && $6 == 1 && $7 == 0) }' && [[ -n $r ]] \
  && ok "f32 weights + f32 KV: KL 0, agreement 1, logit error 0" || bad "f32 row equals the reference" "$r"
r=$(row f32 f32 true)
echo "$r" | awk '{ exit !($4 > 1 && $4 < 100) }' && [[ -n $r ]] \
  && ok "reference perplexity finite and > 1 ($(echo $r | cut -d' ' -f4))" || bad "reference perplexity" "$r"
echo "$rows" | awk '{ if (!($4 > 1 && $4 < 1e6)) bad = 1 } END { exit bad }' \
  && ok "every perplexity finite and > 1" || bad "every perplexity finite and > 1" "$rows"
r16=$(row f32 f16 false)
echo "$r16" | awk '{ exit !($5 < 1e-3 && $6 > 0.95) }' && [[ -n $r16 ]] \
  && ok "f16 KV: KL < 1e-3" || bad "f16 KV close to f32" "$r16"
q8=$(row q8_0 f16 false) q4=$(row q4_0 f16 false)
echo "$q8" | awk '{ exit !($5 > 0 && $5 < 0.01 && $6 > 0.9) }' && [[ -n $q8 ]] \
  && ok "q8_0: KL < 0.01 ($(echo $q8 | cut -d' ' -f5)), top-1 > 90%" || bad "q8_0 close to f32" "$q8"
[[ -n $q4 && -n $q8 ]] && awk -v a="$(echo $q4 | cut -d' ' -f5)" -v b="$(echo $q8 | cut -d' ' -f5)" 'BEGIN { exit !(a > b) }' \
  && ok "q4_0 KL ($(echo $q4 | cut -d' ' -f5)) > q8_0 KL" || bad "q4_0 further than q8_0" "$q4 / $q8"
if command -v python3 >/dev/null; then
  python3 -m json.tool "$tmp/ev.json" >/dev/null 2>&1 && ok "--json writes valid JSON" || bad "--json writes valid JSON" "$(head -c 300 "$tmp/ev.json")"
fi

# A profile works as the model source (only the file's own weights, f16 KV: quick).
printf 'model:\n  path: %s\nthreads: 1\n' "$M" > "$tmp/p.yaml"
out=$($K eval "$tmp/p.yaml" --text $TEXT --weights none --kv f16 --ctx 128 -q 2>&1); rc=$?
[[ $rc == 0 && $out == *"f32 (file)"* && $out == *"f16"* ]] && ok "profile as the model source" || bad "profile as the model source" "$out"

# Errors.
out=$($K eval -m "$M" 2>&1); rc=$?
[[ $rc == 2 && $out == *"--text"* ]] && ok "missing --text: usage error" || bad "missing --text" "$out"
out=$($K eval -m "$M" --text "$tmp/none.txt" 2>&1); rc=$?
[[ $rc == 1 && $out == *"$tmp/none.txt"* ]] && ok "missing text file: error naming it" || bad "missing text file" "$out"
: > "$tmp/empty.txt"
out=$($K eval -m "$M" --text "$tmp/empty.txt" 2>&1); rc=$?
[[ $rc == 1 && $out == *empty* ]] && ok "empty text: clear error" || bad "empty text" "$out"
printf 'a' > "$tmp/one.txt"
out=$($K eval -m "$M" --text "$tmp/one.txt" --no-bos --weights f32 --kv none 2>&1); rc=$?
[[ $rc == 1 && $out == *"at least 2"* ]] && ok "text under 2 tokens: clear error" || bad "text under 2 tokens" "$out"
out=$($K eval -m "$M" --text $TEXT --weights q8_0,q3_zz 2>&1); rc=$?
[[ $rc == 2 && $out == *q3_zz* ]] && ok "bad weight type: usage error naming it" || bad "bad weight type" "$out"
out=$($K eval -m "$M" --text $TEXT --kv int7 2>&1); rc=$?
[[ $rc == 2 && $out == *int7* ]] && ok "bad KV dtype: usage error naming it" || bad "bad KV dtype" "$out"
out=$($K eval -m "$M" --text $TEXT --ctx 1 2>&1); rc=$?
[[ $rc == 2 && $out == *ctx* ]] && ok "--ctx 1: usage error" || bad "--ctx 1" "$out"
out=$($K eval -m $S/models/stories260K.bin --tokenizer $S/models/tok512.bin --text $TEXT --weights q8_0 2>&1); rc=$?
[[ $rc == 1 && $out == *GGUF* ]] && ok "llama2.c checkpoint cannot be re-encoded: says so" || bad "llama2.c re-encode" "$out"

# An interrupted eval leaves nothing in $TMPDIR: SIGTERM or SIGINT while a
# variant is being re-encoded (its private directory is there), and while
# the configurations run (the variants are mapped and already unlinked, so
# not even SIGKILL leaves them behind).
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -f $SMOL ]]; then
  for sig in TERM INT KILL; do
    for phase in quantize forward; do
      [[ $sig == KILL && $phase == quantize ]] && continue # only the writer's own window is open to SIGKILL
      td="$tmp/td-$sig-$phase"; mkdir "$td"
      TMPDIR="$td" $K eval -m "$SMOL" --text $TEXT --weights f32,q8_0 --kv f16 -t 1 --ctx 64 >/dev/null 2>"$td.log" & ep=$!
      seen=0
      for _ in $(seq 1 1500); do
        if [[ $phase == quantize ]]; then compgen -G "$td/kvtop-eval-*/*" >/dev/null && { seen=1; break; }
        else grep -q "window" "$td.log" && { seen=1; break; }; fi
        kill -0 $ep 2>/dev/null || break
        sleep 0.02
      done
      kill -$sig $ep 2>/dev/null; wait $ep 2>/dev/null; rc=$?
      [[ $seen == 1 && $rc -gt 128 && -z $(ls -A "$td") ]] \
        && ok "eval interrupted by SIG$sig during $phase leaves \$TMPDIR empty" \
        || bad "eval SIG$sig during $phase (seen $seen, rc $rc)" "$(ls -AR "$td" | head -c 300)"
    done
  done
else
  bad "SmolLM2 model missing (run make models)"
fi

echo "$pass passed, $fail failed"
