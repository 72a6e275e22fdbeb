#!/usr/bin/env bash
# End-to-end checks of `kvtop serve` on 127.0.0.1 (free ports, every wait
# bounded): curl against every route (auth, 404/405/413, SSE, the snapshot
# stream and the control endpoint), the official openai Python client and
# prometheus_client's parser on SmolLM2 (tests/server/py/openai_client.py),
# greedy server text == `kvtop bench --outputs` == `kvtop generate` for the
# same prompts, --metrics-prefix vllm, startup failures, and SIGTERM exiting
# 0. Without SmolLM2 or the Python packages those parts say they skipped.
# Prints "N passed, N failed".
set -u
K=${KVTOP_BIN:-./kvtop}
S=${KVTOP_SHARED:-../shared}
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
STORIES=$S/models/stories260K.gguf
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
export PYTHONPATH=build/pydeps${PYTHONPATH:+:$PYTHONPATH}
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "  ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [[ -n ${2:-} ]] && echo "     got: $(echo "$2" | head -c 600)"; }

# serve NAME ARGS...: starts `kvtop serve ARGS --port 0` logging to $T/NAME.log,
# waits (60 s at most) for "ready"; sets PID and BASE.
serve() {
  local name=$1; shift
  "$K" serve "$@" --host 127.0.0.1 --port 0 </dev/null >"$T/$name.log" 2>&1 &
  PID=$!
  PIDS+=("$PID")
  BASE=
  for _ in $(seq 1 600); do
    grep -q 'kvtop serve: ready' "$T/$name.log" 2>/dev/null && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  BASE=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/$name.log" | head -n 1)
  grep -q 'kvtop serve: ready' "$T/$name.log"
}
# stop PID: SIGTERM, then the exit status (10 s at most).
stop() {
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  wait "$1"
}
code() { curl -s -o "$T/body" -w '%{http_code}' --max-time 30 "$@"; }

# ---- a small model, an API key: every route with curl ----
serve tiny profiles/default.yaml --set model.path="$STORIES" --set threads=1 --api-key KEY \
  --set server.max_body=64KiB || bad "serve on stories260K starts" "$(tail -n 3 "$T/tiny.log")"
H=(-H "Authorization: Bearer KEY" -H "Content-Type: application/json")
[[ $(code "$BASE/health") == 200 ]] && grep -q '"ok"' "$T/body" && ok "/health 200 without the key" ||
  bad "/health" "$(cat "$T/body")"
[[ $(code "$BASE/v1/models") == 401 ]] && grep -q '"authentication_error"' "$T/body" &&
  ok "/v1/models without the key: 401, OpenAI-shaped" || bad "401" "$(cat "$T/body")"
[[ $(code -H "Authorization: Bearer KEY2" "$BASE/v1/models") == 401 ]] && ok "a wrong key: 401" || bad "wrong key"
[[ $(code "${H[@]}" "$BASE/v1/models") == 200 ]] && grep -q '"stories260K"' "$T/body" && ok "/v1/models names the model" ||
  bad "/v1/models" "$(cat "$T/body")"
[[ $(code "${H[@]}" "$BASE/v1/nope") == 404 ]] && ok "unknown route: 404" || bad "404"
c=$(curl -s -D "$T/hdr" -o "$T/body" -w '%{http_code}' "${H[@]}" "$BASE/v1/completions")
[[ $c == 405 ]] && grep -qi '^Allow: POST' "$T/hdr" && ok "GET on a POST route: 405 with Allow" || bad "405" "$c $(cat "$T/hdr")"
head -c 100000 /dev/zero | tr '\0' 'x' >"$T/big"
[[ $(code "${H[@]}" --data-binary @"$T/big" "$BASE/v1/completions") == 413 ]] && grep -q 'server.max_body' "$T/body" &&
  ok "a body above server.max_body: 413" || bad "413" "$(cat "$T/body")"
[[ $(code "${H[@]}" -d '{"prompt": "x", "temperature": -3}' "$BASE/v1/completions") == 400 ]] &&
  grep -q '"param":"temperature"' "$T/body" && ok "temperature -3: 400 naming the field" || bad "400" "$(cat "$T/body")"
[[ $(code "${H[@]}" -d '{"prompt": "Once upon", "max_tokens": 9999}' "$BASE/v1/completions") == 400 ]] &&
  grep -q 'exceeds the context' "$T/body" && ok "prompt + max_tokens over the context: 400 with the engine's reason" ||
  bad "context 400" "$(cat "$T/body")"
[[ $(code "${H[@]}" -d '{"prompt": [1, 99999], "max_tokens": 4}' "$BASE/v1/completions") == 400 ]] &&
  grep -q 'outside the vocabulary' "$T/body" && grep -q '"param":"prompt\[0\]"' "$T/body" &&
  ok "token ids outside the vocabulary: 400 naming the prompt" || bad "bad ids" "$(cat "$T/body")"
[[ $(code "${H[@]}" -d '{"prompt": [1, 403, 407], "max_tokens": 4, "n": 2, "seed": 5, "temperature": 1, "ignore_eos": true}' "$BASE/v1/completions") == 200 ]] &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["choices"]; sys.exit(0 if [x["index"] for x in c]==[0,1] and d["usage"]["completion_tokens"]==8 else 1)' "$T/body" &&
  ok "token-id prompt, n=2: two choices, usage over both" || bad "ids n=2" "$(cat "$T/body")"
[[ $(code "${H[@]}" -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' "$BASE/v1/completions") == 200 ]] &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); u=d["usage"]; sys.exit(0 if d["object"]=="text_completion" and u["completion_tokens"]==8 and u["total_tokens"]==u["prompt_tokens"]+8 else 1)' "$T/body" &&
  ok "completions: text and usage" || bad "completions" "$(cat "$T/body")"
curl -sN --max-time 30 "${H[@]}" -d '{"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' \
  "$BASE/v1/completions" >"$T/sse"
n_data=$(grep -c '^data: ' "$T/sse")
[[ $(tail -n 2 "$T/sse" | head -n 1) == "data: [DONE]" ]] && grep -q '"finish_reason":"length"' "$T/sse" &&
  grep -q '"choices":\[\],"usage":{"prompt_tokens"' "$T/sse" && (( n_data >= 8 )) &&
  ok "SSE: chunks, finish_reason, a usage chunk, [DONE] ($n_data events)" || bad "SSE" "$(cat "$T/sse")"
c=$(curl -s -D "$T/hdr" -o "$T/body" -w '%{http_code}' "$BASE/metrics")
[[ $c == 200 ]] && grep -qi 'content-type: text/plain; version=0.0.4' "$T/hdr" &&
  grep -q '^kvtop:num_requests_running{model_name="stories260K"} 0' "$T/body" &&
  ok "/metrics: Prometheus text without the key" || bad "/metrics" "$c $(head -c 300 "$T/body")"
[[ $(code "${H[@]}" "$BASE/kvtop/v1/snapshot?check=1") == 200 ]] &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["check"]["ok"] and len(d["blocks"]["state"])==d["config"]["n_blocks"] and "paused" in d and d["requests"] else 1)' "$T/body" &&
  ok "/kvtop/v1/snapshot: the whole snapshot, kv_engine_check clean" || bad "snapshot" "$(head -c 300 "$T/body")"
curl -sN --max-time 20 "${H[@]}" "$BASE/kvtop/v1/stream?interval_ms=50&max_frames=3" >"$T/frames"
[[ $(grep -c '^data: {' "$T/frames") == 3 ]] && sed -n 3p "$T/frames" | grep -q '"delta":true' &&
  ok "/kvtop/v1/stream: 3 frames at 50 ms, deltas after the first" || bad "stream" "$(head -c 300 "$T/frames")"
[[ $(code -H "Content-Type: application/json" -d '{"action": "pause"}' "$BASE/kvtop/v1/control") == 401 ]] &&
  ok "control without the key: 401" || bad "control 401"
[[ $(code "${H[@]}" -d '{"action": "pause"}' "$BASE/kvtop/v1/control") == 200 ]] && grep -q '"paused":true' "$T/body" &&
  ok "control: pause" || bad "pause" "$(cat "$T/body")"
s0=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$T/body")
curl -s --max-time 30 "${H[@]}" -d '{"prompt": "Once", "max_tokens": 4, "stream": true}' "$BASE/v1/completions" >"$T/paused-stream" &
cp=$!
sleep 0.3
code "${H[@]}" -d '{"action": "step"}' "$BASE/kvtop/v1/control" >/dev/null
sleep 0.2
s1=$(code "${H[@]}" "$BASE/kvtop/v1/snapshot" >/dev/null; python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$T/body")
(( s1 == s0 + 1 )) && ok "control: step runs exactly one step while paused ($s0 -> $s1)" || bad "step" "$s0 -> $s1"
[[ $(code "${H[@]}" -d '{"action": "resume"}' "$BASE/kvtop/v1/control") == 200 ]] && grep -q '"paused":false' "$T/body" &&
  wait $cp && grep -q 'data: \[DONE\]' "$T/paused-stream" && ok "control: resume; the paused stream completes" ||
  bad "resume" "$(cat "$T/body")"
stop "$PID"; rc=$?
[[ $rc == 0 ]] && grep -q 'kvtop serve: stopped' "$T/tiny.log" && ok "SIGTERM: exits 0" || bad "SIGTERM exit $rc" "$(tail -n 3 "$T/tiny.log")"

# ---- no key: the control endpoint is off; --metrics-prefix vllm ----
serve nokey profiles/default.yaml --set model.path="$STORIES" --set threads=1 --metrics-prefix vllm ||
  bad "serve without a key starts" "$(tail -n 3 "$T/nokey.log")"
[[ $(code -d '{"action": "pause"}' "$BASE/kvtop/v1/control") == 403 ]] && ok "control without a configured key: 403" ||
  bad "control 403" "$(cat "$T/body")"
[[ $(code -d '{"prompt": "hi", "max_tokens": 2}' "$BASE/v1/completions") == 200 ]] && ok "no key: the API is open" ||
  bad "open API" "$(cat "$T/body")"
[[ $(code "$BASE/v1/models") == 200 ]] && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["data"][0]["warnings"]==[] else 1)' "$T/body" &&
  ok "a model that loads cleanly: no warnings in /v1/models" || bad "no warnings" "$(cat "$T/body")"
code "$BASE/metrics" >/dev/null
grep -q '^vllm:generation_tokens_total{model_name="stories260K"} 2' "$T/body" && grep -q '^vllm:cache_config_info{' "$T/body" &&
  grep -q '^kvtop:kv_blocks{' "$T/body" && ! grep -q '^kvtop:num_requests_running' "$T/body" &&
  ok "--metrics-prefix vllm: vLLM's names under vllm:, kvtop's own under kvtop:" || bad "vllm prefix" "$(head -c 300 "$T/body")"
stop "$PID" >/dev/null

# ---- server.max_queue bounds what waits in the engine beyond its free batch slots: 429 past it ----
serve queue profiles/default.yaml --set model.path="$STORIES" --set threads=1 --set scheduler.max_seqs=1 \
  --set server.max_queue=1 --api-key KEY || bad "serve with server.max_queue=1 starts" "$(tail -n 3 "$T/queue.log")"
code "${H[@]}" -d '{"action": "pause"}' "$BASE/kvtop/v1/control" >/dev/null
qp=()
for i in 1 2; do
  curl -s -o "$T/q$i" -w '%{http_code}' --max-time 30 "${H[@]}" -d '{"prompt": "Once", "max_tokens": 4}' \
    "$BASE/v1/completions" >"$T/q$i.code" &
  qp+=($!)
done
sleep 1 # both submitted: a paused engine takes nothing in, so they stay waiting
c3=$(code "${H[@]}" -d '{"prompt": "Once", "max_tokens": 4}' "$BASE/v1/completions")
[[ $c3 == 429 ]] && grep -q 'server.max_queue 1' "$T/body" && grep -q '"rate_limit_error"' "$T/body" &&
  [[ $(code "$BASE/health") == 200 ]] &&
  ok "max_seqs 1, max_queue 1: two submitted (engine paused: one for the free slot, one waiting), the third gets 429; /health answers" ||
  bad "max_queue 429" "$c3 $(cat "$T/body")"
code "${H[@]}" -d '{"action": "resume"}' "$BASE/kvtop/v1/control" >/dev/null
wait "${qp[@]}"
[[ $(cat "$T/q1.code") == 200 && $(cat "$T/q2.code") == 200 ]] &&
  [[ $(code "${H[@]}" -d '{"prompt": "Once", "max_tokens": 4}' "$BASE/v1/completions") == 200 ]] &&
  ok "max_queue: the waiting two complete after resume, and the queue takes requests again" ||
  bad "max_queue after resume" "$(cat "$T/q1.code" "$T/q2.code") $(cat "$T/body")"
stop "$PID" >/dev/null

# ---- kvtop PROFILE --serve PORT: the TUI and the server on one engine ----
if ! command -v tmux >/dev/null; then
  echo "  skipped: tmux not installed (make setup): kvtop --serve"
else
  sock=kvtop-serve-$$
  tm() { tmux -L "$sock" -f /dev/null "$@"; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  XDG_STATE_HOME=$T/state tm new-session -d -s tui -x 120 -y 40 \
    "$K profiles/default.yaml --set model.path=$STORIES --set threads=1 --serve $port --frames 900"
  TB=http://127.0.0.1:$port
  for _ in $(seq 1 300); do [[ $(curl -s -o /dev/null -w '%{http_code}' "$TB/health") == 200 ]] && break; sleep 0.1; done
  [[ $(code "$TB/health") == 200 ]] && tm capture-pane -p -t tui | grep -q "serving the OpenAI API on http://127.0.0.1:$port" &&
    ok "kvtop --serve: the TUI says where it serves, /health 200" || bad "--serve starts" "$(tm capture-pane -p -t tui | tail -n 5)"
  [[ $(code -d '{"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": true}' "$TB/v1/completions") == 200 ]] &&
    grep -q '"completion_tokens":8' "$T/body" && ok "--serve: an outside client is served by the TUI's engine" ||
    bad "--serve completion" "$(cat "$T/body")"
  # the tab's own replies still arrive (the server hands the tab its events): a second
  # message is sent only once the first reply is done
  tab_done() { code "$TB/kvtop/v1/snapshot" >/dev/null
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(1 for r in d["requests"] if r["session"] < 1000 and r["state"] == "finished"))' "$T/body"; }
  tm send-keys -t tui "Once upon a time" Enter
  for _ in $(seq 1 100); do [[ $(tab_done) -ge 1 ]] && break; sleep 0.1; done
  sleep 0.5
  tm send-keys -t tui "The end" Enter
  for _ in $(seq 1 100); do [[ $(tab_done) -ge 2 ]] && break; sleep 0.1; done
  code "$TB/kvtop/v1/snapshot" >/dev/null
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["requests"]; sys.exit(0 if sum(1 for x in r if x["session"] < 1000 and x["state"]=="finished")>=2 and any(x["session"]==2000 for x in r) else 1)' "$T/body" &&
    ok "--serve: the tab's two replies and the client's request share the engine (its snapshot shows both owners)" ||
    bad "--serve: tab replies" "$(tm capture-pane -p -t tui | tail -n 8)"
  tm send-keys -t tui C-c
  for _ in $(seq 1 100); do tm has-session -t tui 2>/dev/null || break; sleep 0.1; done
  ! tm has-session -t tui 2>/dev/null && [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$TB/health") == 000 ]] &&
    ok "--serve: quitting the TUI stops the server" || bad "--serve: quit"
  tm kill-server 2>/dev/null
fi

# ---- load warnings (an unknown pre-tokenizer): logged, in /v1/models and the snapshot, on the TUI's status line ----
if python3 tests/server/py/vocab_gguf.py "$T/vocab.gguf" && "$K" mkmodel -o "$T/warn.gguf" --vocab-from "$T/vocab.gguf" \
  --dim 64 --layers 1 --heads 2 --kv-heads 1 --ffn 64 --ctx 256 >/dev/null 2>&1; then
  W="tokenizer: tokenizer.ggml.pre 'frobnicator-9' is not a pre-tokenizer kvtop knows"
  if serve warn profiles/default.yaml --set model.path="$T/warn.gguf" --set threads=1; then
    grep -qF "kvtop serve: warning: $W" "$T/warn.log" && ok "load warning: logged at start" || bad "warning log" "$(cat "$T/warn.log")"
    code "$BASE/v1/models" >/dev/null
    python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["data"][0]["warnings"]; sys.exit(0 if len(w)==1 and w[0].startswith(sys.argv[2]) else 1)' "$T/body" "$W" &&
      ok "load warning: in the /v1/models entry" || bad "warning in /v1/models" "$(cat "$T/body")"
    code "$BASE/kvtop/v1/snapshot" >/dev/null
    python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["warnings"]; sys.exit(0 if len(w)==1 and w[0].startswith(sys.argv[2]) else 1)' "$T/body" "$W" &&
      ok "load warning: in /kvtop/v1/snapshot" || bad "warning in the snapshot" "$(head -c 300 "$T/body")"
    stop "$PID" >/dev/null
  else
    bad "serve on a model with an unknown pre-tokenizer starts" "$(tail -n 3 "$T/warn.log")"
  fi
  if command -v tmux >/dev/null; then
    wsock=kvtop-warn-$$
    XDG_STATE_HOME=$T/state tmux -L "$wsock" -f /dev/null new-session -d -s w -x 200 -y 40 \
      "$K profiles/default.yaml --set model.path=$T/warn.gguf --set threads=1 --frames 600"
    seen=
    for _ in $(seq 1 100); do
      tmux -L "$wsock" capture-pane -p -t w 2>/dev/null | grep -qF "warning: $W" && { seen=1; break; }
      sleep 0.1
    done
    [[ -n $seen ]] && ok "load warning: on the TUI's status line" ||
      bad "TUI warning" "$(tmux -L "$wsock" capture-pane -p -t w 2>/dev/null | tail -n 4)"
    tmux -L "$wsock" kill-server 2>/dev/null
  fi
else
  bad "a model with an unknown pre-tokenizer (vocab_gguf.py, kvtop mkmodel)"
fi
# ---- server.api_key is a secret: dumps and reports print *** ----
out=$("$K" keys profiles/default.yaml --set server.api_key=sekrit-42 2>&1)
! grep -q sekrit <<<"$out" && grep -q '^  api_key: "\*\*\*"$' <<<"$out" && ok "kvtop keys: server.api_key shows as ***" ||
  bad "keys redaction" "$(grep api_key <<<"$out")"
if "$K" bench profiles/default.yaml --set model.path="$STORIES" --set threads=1 --set server.api_key=sekrit-42 \
  --set workload.requests=2 --set workload.output_len=4 --json "$T/b.json" </dev/null >/dev/null 2>&1; then
  ! grep -q sekrit "$T/b.json" && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["config"]["server"]["api_key"]=="***" and "api_key: \"***\"" in d["config_yaml"] else 1)' "$T/b.json" &&
    ok "bench JSON: the key as *** in config and config_yaml" || bad "bench redaction" "$(grep -o '.api_key.\{0,20\}' "$T/b.json")"
else
  bad "kvtop bench with a key set"
fi
out=$("$K" keys profiles/default.yaml --set 'server.api_key=***' 2>&1); rc=$?
[[ $rc == 2 ]] && grep -q "server.api_key: '\*\*\*' is what a dump shows" <<<"$out" && ok "'***' as a key is refused (a redacted dump never loads back as a key)" ||
  bad "*** refused ($rc)" "$out"

# ---- startup failures: clear messages, exit 1 / 2 ----
out=$("$K" serve profiles/default.yaml --set model.path=/nonexistent.gguf --port 0 2>&1 </dev/null); rc=$?
[[ $rc == 1 ]] && echo "$out" | grep -q 'nonexistent' && ok "a model that does not load: exit 1 naming it" || bad "load failure ($rc)" "$out"
out=$("$K" serve profiles/default.yaml --port 99999 2>&1 </dev/null); rc=$?
[[ $rc == 2 ]] && echo "$out" | grep -q 'server.port' && ok "--port out of range: exit 2 naming server.port" || bad "port ($rc)" "$out"
out=$("$K" serve profiles/default.yaml --bogus 2>&1 </dev/null); rc=$?
[[ $rc == 2 ]] && ok "an unknown option: exit 2" || bad "unknown option ($rc)" "$out"

# ---- SmolLM2: the openai client, greedy text == bench == generate ----
if [[ ! -f $SMOL ]]; then
  echo "  skipped: $SMOL not found (make models): openai client and greedy checks"
elif ! python3 -c 'import openai, prometheus_client' 2>/dev/null; then
  echo "  skipped: openai / prometheus_client not installed (make pydeps): client checks"
else
  if serve smol profiles/default.yaml --api-key KEY; then
    out=$(timeout 300 python3 tests/server/py/openai_client.py "$BASE" KEY 2>&1); rc=$?
    np=$(echo "$out" | tail -n 1 | grep -oE '^[0-9]+')
    [[ $rc == 0 ]] && ok "openai client: ${np:-0} checks (chat, completions, streaming, stop, seeds, n, errors, metrics)" ||
      bad "openai client" "$(echo "$out" | grep -v '^  ok')"
    printf '%s\n' '{"prompt": "The capital of France is"}' '{"prompt": "Here is a list of colors:"}' \
      '{"prompt": "def add(a, b):"}' '{"prompt": "Once upon a time, a robot"}' >"$T/p.jsonl"
    if timeout 300 "$K" bench profiles/default.yaml --set workload.prompts_file="$T/p.jsonl" --set sampling.temperature=0 \
      --set sampling.repeat_penalty=1 --set workload.output_len=32 --set workload.requests=4 --outputs "$T/o.jsonl" \
      </dev/null >"$T/bench.log" 2>&1; then
      out=$(python3 - "$BASE" "$T/p.jsonl" "$T/o.jsonl" "$K" "$SMOL" <<'EOF'
import json, subprocess, sys, urllib.request
base, pf, of, k, smol = sys.argv[1:6]
prompts = [json.loads(l)["prompt"] for l in open(pf)]
outs = [json.loads(l)["text"] for l in open(of)]
same_b = same_g = 0
for i, (p, o) in enumerate(zip(prompts, outs)):
    body = json.dumps({"prompt": p, "max_tokens": 32, "temperature": 0, "repetition_penalty": 1}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Authorization": "Bearer KEY"})
    t = json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]
    same_b += t == o
    if i < 2:
        g = subprocess.run([k, "generate", "-m", smol, "-p", p, "-n", "32", "--temp", "0", "--repeat-penalty", "1"],
                           capture_output=True, text=True, errors="replace", timeout=120).stdout
        g = g[len(p):] if g.startswith(p) else g
        same_g += g.rstrip("\n") == t.rstrip("\n")
print(same_b, same_g)
EOF
)
      [[ $out == "4 2" ]] && ok "greedy: server text == bench --outputs (4/4) == generate (2/2)" || bad "greedy equality (bench, generate): $out"
    else
      bad "kvtop bench --outputs" "$(tail -n 3 "$T/bench.log")"
    fi
    stop "$PID"; rc=$?
    [[ $rc == 0 ]] && ok "SmolLM2 server: SIGTERM exits 0" || bad "SmolLM2 SIGTERM exit $rc"
  else
    bad "serve on SmolLM2 starts" "$(tail -n 3 "$T/smol.log")"
  fi
fi
echo "$pass passed, $fail failed"
