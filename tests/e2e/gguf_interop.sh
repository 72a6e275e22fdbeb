#!/usr/bin/env bash
# Files `kvtop quantize` writes are read by another GGUF implementation:
# gguf-py (llama.cpp's Python library, installed by `make pydeps`) opens each
# type's output and dequantizes every tensor exactly as kvtop does (bit for
# bit, against kvtop's own f32 re-encoding of the same file). Covers the
# legacy types on stories260K (64-wide rows, so K-quants fall back there) and
# the K-quants and mixes on a random model with 256-multiple rows.
# Prints "N passed, N failed"; without gguf-py it says so and counts a skip.
set -u
. "$(dirname "$0")/lib/checks.sh"
export PYTHONPATH=build/pydeps${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c 'import gguf, numpy' 2>/dev/null; then
  echo "  skipped: gguf-py not installed (make pydeps)"
  echo "$pass passed, $fail failed"
  exit 0
fi

check() { # name model types...
  local name=$1 model=$2; shift 2
  local pairs=() t out
  for t in "$@"; do
    if ! out=$($K quantize "$model" "$tmp/$name-$t.gguf" "$t" 2>&1) ||
       ! out=$($K quantize "$tmp/$name-$t.gguf" "$tmp/$name-$t-f32.gguf" f32 2>&1); then
      bad "$name $t: kvtop quantize" "$out"
      continue
    fi
    pairs+=("$tmp/$name-$t.gguf" "$tmp/$name-$t-f32.gguf")
  done
  out=$(python3 tools/gguf_interop.py "${pairs[@]}" 2>&1) && ok "$name: gguf-py reads $* and dequantizes bit-identically" ||
    bad "$name: gguf-py reads $*" "$out"
  echo "$out" | sed 's/^/     /'
}

check stories "$S/models/stories260K.gguf" q8_0 q4_0 q4_1 q5_0 q5_1 f16 bf16
$K mkmodel --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --vocab 1024 -o "$tmp/m.gguf" >/dev/null 2>&1 ||
  bad "mkmodel for the K-quant check"
check kquant "$tmp/m.gguf" q4_k q5_k q6_k q4_k_m q5_k_m

# The check can fail: a flipped byte in a quantized block is caught.
python3 - "$tmp/kquant-q6_k.gguf" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
t = next(t for t in r.tensors if t.tensor_type.name == "Q6_K")
off = int(t.data_offset) + 7
data = bytearray(open(sys.argv[1], "rb").read())
data[off] ^= 0x5a
open(sys.argv[1], "wb").write(bytes(data))
PY
out=$(python3 tools/gguf_interop.py "$tmp/kquant-q6_k.gguf" "$tmp/kquant-q6_k-f32.gguf" 2>&1)
[[ $? == 1 ]] && ok "a corrupted block is reported as a difference" || bad "a corrupted block is reported" "$out"

finish
