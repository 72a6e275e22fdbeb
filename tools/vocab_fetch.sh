#!/usr/bin/env bash
# vocab_fetch.sh - puts llama.cpp's vocabulary test sets (models/ggml-vocab-*.gguf with their .inp/.out
# files, as vendored in the llama-cpp-python sdist on PyPI) into a cache folder and prints its path.
# Fetches the sdist once (`pip download --no-deps --no-binary :all:`) into build/llama-sdist, or uses
# $LLAMA_CPP_SDIST (a .tar.gz) or ${TMPDIR:-/tmp}/kvtop-peers/ when a copy is already there, and
# extracts only the vocab files into build/llama-vocab. Exit 1 (and a reason on stderr) when offline.
set -u
VER=${LLAMA_CPP_PY_VER:-0.3.36}
BUILD=${BUILD:-build}
out=${KVTOP_VOCAB_DIR:-$BUILD/llama-vocab}
if [[ -f $out/.done ]]; then echo "$out"; exit 0; fi
tgz=${LLAMA_CPP_SDIST:-}
if [[ -z $tgz ]]; then
  for c in "$BUILD/llama-sdist/llama_cpp_python-$VER.tar.gz" "${TMPDIR:-/tmp}/kvtop-peers/llama_cpp_python-$VER.tar.gz"; do
    [[ -f $c ]] && { tgz=$c; break; }
  done
fi
if [[ -z $tgz ]]; then
  mkdir -p "$BUILD/llama-sdist"
  if ! timeout 300 pip download -q --no-deps --no-binary :all: -d "$BUILD/llama-sdist" \
       "llama-cpp-python==$VER" >/dev/null 2>&1; then
    echo "vocab_fetch: cannot download llama-cpp-python==$VER from PyPI (offline?)" >&2
    exit 1
  fi
  tgz=$BUILD/llama-sdist/llama_cpp_python-$VER.tar.gz
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! tar -xzf "$tgz" -C "$tmp" --wildcards "llama_cpp_python-$VER/vendor/llama.cpp/models/ggml-vocab-*" 2>/dev/null; then
  echo "vocab_fetch: $tgz has no vendor/llama.cpp/models/ggml-vocab-* files" >&2
  exit 1
fi
mkdir -p "$out"
n=0
for o in "$tmp/llama_cpp_python-$VER/vendor/llama.cpp/models/"ggml-vocab-*.gguf.out; do
  g=${o%.out}
  [[ -f $g && -f $g.inp ]] || continue
  cp "$g" "$g.inp" "$o" "$out/" && n=$((n + 1))
done
(( n > 0 )) || { echo "vocab_fetch: no test sets found in $tgz" >&2; exit 1; }
touch "$out/.done"
echo "$out"
