#!/usr/bin/env bash
# The precision and profiling tools behind the README's "f16 vs f32 KV
# precision" and "Where decode time goes" sections, on stories260K (f32
# weights: no activation quantization, so the figures are tight):
# kv_precision finds nothing between a cache and itself, a small but
# nonzero difference between f16 and f32, a nonzero summation-order floor
# with --cfg-isa, and reports greedy divergence per prompt; decode_profile
# accounts for every op of a decode step. Prints "N passed, N failed".
set -u
BUILD=${BUILD:-build}
S=${KVTOP_SHARED:-../shared}
M=$S/models/stories260K.gguf
KP=$BUILD/tools/kv_precision
DP=$BUILD/tools/decode_profile
T=data/eval/kvtop-eval.txt
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 600)"; }
# field N (1-based, after the leading bar) of the last table row of $1
col() { echo "$1" | grep '^| ' | tail -1 | awk -F'|' -v n="$2" '{gsub(/ /, "", $(n + 1)); print $(n + 1)}'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

if [[ ! -x $KP || ! -x $DP ]]; then
  bad "make builds $KP and $DP (run make test-build)"
  echo "$pass passed, $fail failed"
  exit 1
fi

# ---- kv_precision, text mode ----
out=$($KP 2>&1); rc=$?
[[ $rc == 2 && $out == *usage:* ]] && ok "kv_precision without options: usage, exit 2" || bad "kv_precision usage" "$out"
out=$($KP --model "$M" --text "$T" --cfg nope 2>&1); rc=$?
[[ $rc == 2 && $out == *"unknown KV dtype 'nope'"* ]] && ok "an unknown dtype is named" || bad "bad dtype" "$out"
out=$($KP --model "$M" --text "$T" --ctx 100000 2>&1); rc=$?
[[ $rc == 1 && $out == *"no chunk of 100000"* ]] && ok "a context past the text or model: error" || bad "ctx" "$out"
out=$($KP --model "$M" --text "$T" --ctx 128 --threads 1 --cfg f32 2>&1); rc=$?
[[ $rc == 0 && $(col "$out" 5) == 0 && $(col "$out" 7) == 100.00% && $(col "$out" 8) == 0.0000 ]] \
  && ok "f32 against itself: KL 0, top-1 100%, logit error 0" || bad "f32 vs f32" "$out"
out=$($KP --model "$M" --text "$T" --ctx 128 --threads 1 --cfg f16 2>&1); rc=$?
kl=$(col "$out" 5) err=$(col "$out" 8)
[[ $rc == 0 ]] && lt 0 "$kl" && lt "$kl" 1e-4 && lt 0 "$err" && lt "$err" 0.5 \
  && ok "f16 against f32: 0 < KL ($kl) < 1e-4, 0 < logit error ($err) < 0.5" || bad "f16 vs f32" "$out"
out=$($KP --model "$M" --text "$T" --ctx 128 --threads 1 --cfg f32 --cfg-isa scalar 2>&1); rc=$?
fl=$(col "$out" 5)
[[ $rc == 0 ]] && lt "$fl" "$kl" && ok "the summation-order floor ($fl) is below f16's KL ($kl)" || bad "floor" "$out"
out=$($KP --model "$M" --text "$T" --ctx 128 --cfg f32 --cfg-isa sse9 2>&1); rc=$?
[[ $rc == 1 && $out == *KVTOP_CPU_ISA=sse9* ]] && ok "--cfg-isa with an unknown ISA: error" || bad "cfg-isa" "$out"

# ---- kv_precision, greedy mode ----
out=$($KP --model "$M" --prompts data/spec/stories.jsonl --n 24 --threads 1 --cfg f32 2>&1); rc=$?
[[ $rc == 0 && $out == *"0 of 8 prompts differ within 24 tokens"* && $(echo "$out" | grep -c 'same over 24') == 8 ]] \
  && ok "greedy, f32 against itself: 8 of 8 the same" || bad "greedy f32" "$out"
out=$($KP --model "$M" --prompts data/spec/stories.jsonl --n 24 --threads 1 --cfg int8 2>&1); rc=$?
rows=$(echo "$out" | grep -cE '^\| [0-9]+ \| [0-9]+ \| ')
[[ $rc == 0 && $rows == 8 && $out =~ [0-9]+\ of\ 8\ prompts\ differ ]] && ok "greedy, int8: a row per prompt and a summary" \
  || bad "greedy int8" "$out"

# ---- decode_profile ----
out=$($DP 2>&1); rc=$?
[[ $rc == 2 && $out == *usage:* ]] && ok "decode_profile without options: usage, exit 2" || bad "decode_profile usage" "$out"
out=$($DP --model "$M" --threads 2 --concurrency 3 --prompt 8 --tokens 6 --hook 1 2>&1); rc=$?
layers=5
calls() { echo "$1" | grep "^| $2 " | awk -F'|' '{gsub(/ /, "", $7); print $7}'; }
qkv=$(calls "$out" 'matmul wq+wk+wv')
gu=$(calls "$out" 'matmul ffn gate+up')
head=$(calls "$out" 'matmul output head')
[[ $rc == 0 && $qkv == 5.0 && $gu == 5.0 && $head == 1.0 ]] \
  && ok "decode_profile: wq+wk+wv and gate+up $layers matmul_multi calls a step, the head one" \
  || bad "decode_profile calls" "$out"
out0=$($DP --model "$M" --threads 2 --concurrency 3 --prompt 8 --tokens 6 --multi 0 2>&1); rc0=$?
[[ $rc0 == 0 && $(calls "$out0" 'matmul wq') == 5.0 && $(calls "$out0" 'matmul ffn up') == 5.0 && \
  -z $(calls "$out0" 'matmul wq+wk+wv') ]] && ok "decode_profile --multi 0: one matmul call per weight" \
  || bad "decode_profile --multi 0" "$out0"
# Each row and the total are printed to 0.001 ms, so the rows' sum may be
# off by half of that per row (a step of stories260K is ~0.15 ms on a fast
# core: the rounding is a few percent of it).
read -r sum nrow < <(echo "$out" | awk -F'|' '/^\| (matmul|attention|kv_store|rmsnorm|rope|silu_mul|add|get_rows|upload)/ { gsub(/ /, "", $3); s += $3; n++ }
  END { print s + 0, n + 0 }')
ops=$(echo "$out" | awk -F'|' '/all backend ops/ { gsub(/ /, "", $3); print $3 }')
[[ $rc == 0 ]] && awk -v a="$sum" -v b="$ops" -v n="$nrow" 'BEGIN { t = 0.01 * b + 0.0005 * (n + 1) + 0.0005; exit !(a > 0 && n > 0 && (a - b < t) && (b - a < t)) }' \
  && ok "the op rows add up to all backend ops ($sum vs $ops ms, $nrow rows)" || bad "op sum" "rows sum to $sum ms over $nrow rows, all backend ops $ops ms; $out"
[[ $out =~ pure\ decode\ steps && $out == *"engine's own work"* ]] && ok "decode_profile reports the engine's own work" \
  || bad "engine row" "$out"

echo "$pass passed, $fail failed"
[[ $fail == 0 ]]
