#!/usr/bin/env bash
# One generation path: `kvtop generate` and `kvtop chat` run on the engine,
# so generate's greedy text is what `kvtop bench --outputs` gives for the
# same prompts on the default profile; --stop ends a reply before the stop
# string; chat ends a reply at the template's end of turn and goes on over
# several turns; sampling flags take the profile keys' ranges and messages.
# SmolLM2 when it is present, stories260K otherwise (and for the tiny-model
# checks). Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
TINY=$S/models/stories260K.gguf
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 400)"; }

if [[ -f $SMOL ]]; then
  M=$SMOL
  prompts=("The capital of France is" "Here is a list of colors:" "def add(a, b):" "Once upon a time, a robot"
           $'Question: What is 7 times 8?\nAnswer:' "The best way to learn")
else
  M=$TINY
  prompts=("Once upon a time" "Lily saw a cat" "The dog ran" "Tom and his mom" "One day, a bird" "The sun was")
fi
echo "  (model $M)"

# generate == bench --outputs, prompt by prompt, on the default profile.
for p in "${prompts[@]}"; do python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1]}))' "$p"; done >"$T/p.jsonl"
$K bench profiles/default.yaml --set model.path="$M" --set workload.prompts_file="$T/p.jsonl" \
  --set sampling.temperature=0 --set sampling.repeat_penalty=1 --set workload.output_len=32 \
  --set workload.requests=${#prompts[@]} --outputs "$T/o.jsonl" --quiet </dev/null >"$T/b.log" 2>&1 \
  && ok "bench on the default profile" || bad "bench on the default profile" "$(cat "$T/b.log")"
same=0
for i in "${!prompts[@]}"; do
  p=${prompts[$i]}
  $K generate -m "$M" -p "$p" -n 32 --temp 0 --repeat-penalty 1 >"$T/g$i.txt" 2>"$T/g$i.err"
  python3 - "$T/g$i.txt" "$T/o.jsonl" "$i" "$p" <<'PY' && same=$((same + 1)) || echo "     prompt $i differs: $(head -c 200 "$T/g$i.txt")"
import json, sys
g = open(sys.argv[1], encoding="utf-8", errors="replace").read()
o = [json.loads(l) for l in open(sys.argv[2])][int(sys.argv[3])]["text"]
p = sys.argv[4]
g = g[len(p):] if g.startswith(p) else g
sys.exit(0 if g.rstrip("\n") == o.rstrip("\n") else 1)
PY
done
[[ $same == "${#prompts[@]}" ]] && ok "generate --temp 0 == bench --outputs for every prompt ($same/${#prompts[@]})" \
  || bad "generate vs bench: $same/${#prompts[@]} identical"

# --stop: the reply ends before the stop string; without it the text goes on.
if [[ $M == "$SMOL" ]]; then
  full=$($K generate -m "$M" -p "Count: 1, 2, 3," -n 40 --temp 0 2>/dev/null)
  out=$($K generate -m "$M" -p "Count: 1, 2, 3," -n 40 --temp 0 --stop " 6" 2>/dev/null); rc=$?
  rest=${out#"Count: 1, 2, 3,"}
  [[ $rc == 0 && $full == *" 6"* && $rest == *" 5"* && $rest != *" 6"* ]] && ok "--stop ' 6' ends the count at 5" \
    || bad "--stop ' 6'" "$out"
fi
full=$($K generate -m "$TINY" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
out=$($K generate -m "$TINY" -p "Once upon a time" -n 40 --temp 0 --stop " Lily" --stop "zebra" 2>/dev/null); rc=$?
[[ $rc == 0 && $full == *" Lily"* && $out == "Once upon a time, there was a little girl named" ]] \
  && ok "--stop (repeatable) on stories260K" || bad "--stop on stories260K" "$out"

# chat: the reply ends at the template's end of turn, the next turn works.
if [[ -f $SMOL ]]; then
  out=$(printf 'What is 2+2? Answer briefly.\n/quit\n' | $K chat -m "$SMOL" --temp 0 2>&1); rc=$?
  after=${out#*2+2}
  [[ $rc == 0 && $out != *"<|im_"* && $after != *$'user\n'* && $after == *4* ]] \
    && ok "chat (SmolLM2) stops at the end of turn" || bad "chat end of turn" "$out"
  out=$(printf 'What is the capital of France?\nAnd of Italy?\n/quit\n' | $K chat -m "$SMOL" --temp 0 -n 48 2>&1); rc=$?
  [[ $rc == 0 && $out == *Paris* && $out == *Rome* && $out != *"<|im_"* ]] && ok "chat (SmolLM2): a second turn" \
    || bad "chat second turn" "$out"
fi
out=$(printf 'Once upon a time\nThe cat\n/quit\n' | $K chat -m "$TINY" --temp 0 -n 100 2>&1); rc=$?
replies=$(printf '%s\n' "$out" | grep -c '^ ')
[[ $rc == 0 && $out == *"template plain"* && $replies == 2 && $out != *"User:"* ]] \
  && ok "chat (plain template): one line per reply, two turns" || bad "chat plain template" "$out"
out=$(printf 'Hello\n/quit\n' | $K chat -m "$TINY" --temp 0 -n 100 --stop " toys" 2>&1)
[[ $out == *"play with his"* && $out != *"his toys"* ]] && ok "chat --stop" || bad "chat --stop" "$out"

# Sampling flags: the key table's ranges, and its message, in every front end.
want='sampling.top_k: must be in [0, 1048576], got 2000000'
g=$($K generate -m "$TINY" -p hi --top-k 2000000 2>&1); grc=$?
c=$($K chat -m "$TINY" --top-k 2000000 </dev/null 2>&1); crc=$?
b=$($K bench profiles/default.yaml --set model.path="$TINY" --set sampling.top_k=2000000 2>&1); brc=$?
[[ $grc == 2 && $crc == 2 && $brc == 2 && $g == *"--top-k: $want"* && $c == *"--top-k: $want"* && $b == *"$want"* ]] \
  && ok "--top-k: the key table's range and message in generate, chat and bench" || bad "--top-k range" "$g / $c / $b"
g=$($K generate -m "$TINY" -p hi --repeat-penalty 50 2>&1); grc=$?
b=$($K bench profiles/default.yaml --set model.path="$TINY" --set sampling.repeat_penalty=50 2>&1); brc=$?
[[ $grc == 2 && $brc == 2 && $g == *sampling.repeat_penalty* && $b == *sampling.repeat_penalty* ]] \
  && ok "--repeat-penalty 50: out of range everywhere" || bad "--repeat-penalty range" "$g / $b"
out=$($K generate -m "$TINY" -p hi -n 4 --temp=0 --seed=3 2>&1); rc=$?
[[ $rc == 0 && $out == hi* ]] && ok "--flag=value form" || bad "--flag=value" "$out"
out=$($K generate -m "$TINY" -p hi --stop 2>&1); rc=$?
[[ $rc == 2 && $out == *"--stop needs a value"* ]] && ok "--stop without a value: usage error" || bad "--stop no value" "$out"
out=$($K generate -m "$TINY" -p "Once upon a time" -n 8 --temp 0 --kv-dtype f32 --stats 2>&1 >/dev/null)
[[ $out == *"kv f32"* ]] && ok "--kv-dtype f32 still selectable" || bad "--kv-dtype f32" "$out"
out=$($K generate -m "$TINY" -p "Once upon a time" -n 8 --temp 0 --stats 2>&1 >/dev/null)
[[ $out == *"kv f16"* ]] && ok "generate's KV dtype defaults to the default profile's (f16)" || bad "default kv dtype" "$out"

echo "$pass passed, $fail failed"
