#!/usr/bin/env bash
# Bad input from a hostile or careless user gets a clear error and changes
# nothing: model paths that are not model files, a FIFO that would block, a
# model too large for the disk. Every command is bounded by a timeout, so a
# hang fails the check instead of the run. Prints "N passed, N failed".
set -u
GOT_CHARS=300
. "$(dirname "$0")/lib/checks.sh"
T() { timeout 20 "$@"; }

# Model paths that are not model files: each command says what the path is.
mkdir "$tmp/dir"
mkfifo "$tmp/fifo"
: >"$tmp/empty"
printf 'PK\003\004 this is a zip, not a model, padded to be longer than a header.....' >"$tmp/zip"
run_on() { # CMD MODEL: info takes the model as its argument, the others -m MODEL -p hi
  case $1 in
    info) T $K info "$2" 2>&1 ;;
    tokenize) T $K tokenize -m "$2" -p hi 2>&1 ;;
    generate) T $K generate -m "$2" -p hi -n 2 2>&1 ;;
  esac
}
for cmd in info tokenize generate; do
  out=$(run_on $cmd "$tmp/dir"); rc=$?
  [[ $rc == 1 && $out == *"is a directory"* ]] && ok "$cmd: a directory as the model" || bad "$cmd: a directory (rc $rc)" "$out"
  out=$(run_on $cmd "$tmp/fifo"); rc=$?
  [[ $rc == 1 && $out == *"not a regular file"* ]] && ok "$cmd: a FIFO is refused, not waited on" || bad "$cmd: a FIFO (rc $rc)" "$out"
  out=$(run_on $cmd "$tmp/empty"); rc=$?
  [[ $rc == 1 && $out == *"empty file"* ]] && ok "$cmd: a zero-byte model" || bad "$cmd: a zero-byte model (rc $rc)" "$out"
done
out=$(T $K info "$tmp/zip" 2>&1); rc=$?
[[ $rc == 1 && $out == *"not a GGUF or llama2.c file"* ]] && ok "info: wrong magic says not GGUF or llama2.c" || bad "info: wrong magic" "$out"
out=$(T $K generate -m "$S/models/stories260K.bin" --tokenizer "$tmp/fifo" -p hi -n 2 2>&1); rc=$?
[[ $rc == 1 && $out == *"not a regular file"* ]] && ok "a FIFO as the tokenizer file" || bad "a FIFO as the tokenizer file (rc $rc)" "$out"

# mkmodel checks the disk before it writes: nothing is left behind.
out=$(T $K mkmodel --dim 65536 --layers 1024 --heads 64 --kv-heads 64 --ffn 262144 --vocab 32000 --type f32 -o "$tmp/pb.gguf" 2>&1); rc=$?
[[ $rc == 1 && $out == *"free"* && ! -e $tmp/pb.gguf && ! -e $tmp/pb.gguf.tmp ]] \
  && ok "mkmodel: a model larger than the free disk is refused before writing" || bad "mkmodel too large (rc $rc)" "$out"

# An interrupted quantize leaves no OUT.tmp: wait for the temporary file to
# appear, send SIGTERM, and look again.
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -f $SMOL ]]; then
  for sig in TERM INT; do
    $K quantize "$SMOL" "$tmp/q.gguf" q8_0 >/dev/null 2>&1 & qp=$!
    for _ in $(seq 1 250); do [[ -e $tmp/q.gguf.tmp ]] && break; sleep 0.02; done
    seen=0; [[ -e $tmp/q.gguf.tmp ]] && seen=1
    kill -$sig $qp 2>/dev/null; wait $qp; rc=$?
    [[ $seen == 1 && $rc -gt 128 && ! -e $tmp/q.gguf.tmp && ! -e $tmp/q.gguf ]] \
      && ok "quantize interrupted by SIG$sig removes OUT.tmp" || bad "quantize SIG$sig (seen $seen, rc $rc)" "$(ls "$tmp")"
    rm -f "$tmp"/q.gguf*
  done
else
  bad "SmolLM2 model missing (run make models)"
fi

finish
