#!/usr/bin/env bash
# bench_serve.sh - kvtop serve against llama.cpp's llama-server on the same
# SmolLM2 file, 2 threads each, side by side in one run: tools/serve_bench.py
# at 1, 8, 32 and 64 concurrent streams (prompt ~128 tokens, output 128).
# llama-server is built (once, under $PEERS) from the llama.cpp source
# vendored in the llama-cpp-python sdist on PyPI, CPU only; no code of it
# is copied here. Usage (from the project's root, after `make`):
#
#   tools/bench_serve.sh [OUT_DIR]     # JSON results and logs in OUT_DIR (default bench-serve/)
#
# Env: KVTOP_BIN (./kvtop), MODEL (models/SmolLM2-135M-Instruct.Q4_1.gguf),
# CONC (1,8,32,64), PER_CLIENT (requests per client, 2), PEERS
# ($TMPDIR/kvtop-peers), LLAMA_VER (0.3.36). Every wait is bounded.
set -u
K=${KVTOP_BIN:-./kvtop}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
CONC=${CONC:-1,8,32,64}
PER_CLIENT=${PER_CLIENT:-2}
OUT=${1:-bench-serve}
PEERS=${PEERS:-${TMPDIR:-/tmp}/kvtop-peers}
LLAMA_VER=${LLAMA_VER:-0.3.36}
LLAMA_SRC=$PEERS/llama_cpp_python-$LLAMA_VER/vendor/llama.cpp
LLAMA_SERVER=$LLAMA_SRC/build/bin/llama-server
mkdir -p "$OUT"
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; wait 2>/dev/null' EXIT

if [[ ! -x $LLAMA_SERVER ]]; then
  echo "building llama-server $LLAMA_VER under $PEERS (once; about ten minutes on two cores)"
  mkdir -p "$PEERS" && cd "$PEERS" || exit 1
  [[ -f llama_cpp_python-$LLAMA_VER.tar.gz ]] ||
    python3 -m pip download -q --no-deps --no-binary :all: -d . "llama-cpp-python==$LLAMA_VER" || exit 1
  [[ -d $LLAMA_SRC ]] || tar xzf "llama_cpp_python-$LLAMA_VER.tar.gz" || exit 1
  cmake -S "$LLAMA_SRC" -B "$LLAMA_SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF >"$PEERS/cmake.log" 2>&1 || { echo "cmake failed: $PEERS/cmake.log"; exit 1; }
  cmake --build "$LLAMA_SRC/build" -j2 --target llama-server >"$PEERS/build.log" 2>&1 ||
    { echo "build failed: $PEERS/build.log"; exit 1; }
  cd - >/dev/null || exit 1
fi
export LD_LIBRARY_PATH=$LLAMA_SRC/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_health() { # URL: 200 from /health within 120 s
  for _ in $(seq 1 1200); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$1/health") == 200 ]] && return 0
    kill -0 $PID 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop() { kill -TERM $PID 2>/dev/null; for _ in $(seq 1 100); do kill -0 $PID 2>/dev/null || break; sleep 0.1; done; kill -9 $PID 2>/dev/null; wait $PID 2>/dev/null; PID=; }

# kvtop: one engine for every level (64 sequences a batch, room for 64 x 300 tokens)
port=$(free_port)
"$K" serve profiles/default.yaml --set model.path="$MODEL" --set threads=2 --set scheduler.max_seqs=64 \
  --set kv.memory=512MiB --set server.max_queue=256 --host 127.0.0.1 --port "$port" >"$OUT/kvtop.log" 2>&1 &
PID=$!
wait_health "http://127.0.0.1:$port" || { echo "kvtop serve did not start: $(tail -n 3 "$OUT/kvtop.log")"; exit 1; }
python3 tools/serve_bench.py --url "http://127.0.0.1:$port" --concurrency "$CONC" --requests-per-client "$PER_CLIENT" \
  --label "kvtop serve (2 threads)" --json "$OUT/kvtop.json"
stop

# llama-server: --parallel N slots of 320 tokens for each level, 2 threads
: >"$OUT/llama.jsonl"
for c in ${CONC//,/ }; do
  port=$(free_port)
  "$LLAMA_SERVER" -m "$MODEL" -t 2 -tb 2 --parallel "$c" -c $((c * 320)) --host 127.0.0.1 --port "$port" \
    >"$OUT/llama-$c.log" 2>&1 &
  PID=$!
  wait_health "http://127.0.0.1:$port" || { echo "llama-server did not start: $(tail -n 3 "$OUT/llama-$c.log")"; exit 1; }
  python3 tools/serve_bench.py --url "http://127.0.0.1:$port" --concurrency "$c" --requests-per-client "$PER_CLIENT" \
    --label "llama-server --parallel $c (2 threads)" --json "$OUT/llama-$c.json"
  stop
done
python3 - "$OUT" "$CONC" <<'EOF'
import json, sys
out, conc = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
k = {r["concurrency"]: r for r in json.load(open(f"{out}/kvtop.json"))["levels"]}
print("\nconc   kvtop tok/s  llama tok/s  ratio   kvtop TTFT p99  llama TTFT p99 (ms)")
for c in conc:
    l = json.load(open(f"{out}/llama-{c}.json"))["levels"][0]
    print(f"{c:4d}  {k[c]['output_tok_s']:11.1f}  {l['output_tok_s']:11.1f}  {k[c]['output_tok_s'] / max(l['output_tok_s'], 1e-9):5.2f}"
          f"   {k[c]['ttft_p99_ms']:14.0f}  {l['ttft_p99_ms']:14.0f}")
EOF
