"""openai_client.py BASE KEY - kvtop serve driven by the official openai
Python client (and prometheus_client's parser for /metrics), on SmolLM2.
Prints one line per check ("  ok ..." or "FAIL ...") and ends with
"N passed, N failed"; exits 1 on any failure. Every call has a timeout.
"""
import json
import math
import sys
import urllib.error
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

sys.dont_write_bytecode = True  # importing checks leaves no __pycache__ in the tree
from checks import check, finish  # noqa: E402

BASE, KEY = sys.argv[1], sys.argv[2]


def metrics():
    txt = urllib.request.urlopen(BASE + "/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(txt):
        for s in fam.samples:
            out.setdefault(s.name, 0.0)
            out[s.name] += s.value
    return out, txt


c = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, timeout=60, max_retries=0)
models = [m.id for m in c.models.list().data]
check(len(models) == 1, "models.list has the one model", models)
M = models[0]
m0, _ = metrics()

r = c.chat.completions.create(model=M, messages=[{"role": "user", "content": "What is the capital of France?"}],
                              max_tokens=32, temperature=0)
check("Paris" in (r.choices[0].message.content or ""), "chat: Paris", r.choices[0].message.content)
check(r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.role == "assistant", "chat: finish, role")
u = r.usage
check(u.prompt_tokens > 0 and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens,
      "chat: usage adds up", u)
check(u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0, "chat: cached_tokens")
# the same conversation again: its prompt comes from the prefix cache
r2 = c.chat.completions.create(model=M, messages=[{"role": "user", "content": "What is the capital of France?"}],
                               max_tokens=4, temperature=0)
check(r2.usage.prompt_tokens_details.cached_tokens > 0, "chat: a repeated prompt hits the prefix cache",
      r2.usage.prompt_tokens_details)

# streaming with usage
parts, usage, last_finish, roles, n_chunks = [], None, None, 0, 0
for ch in c.chat.completions.create(model=M, messages=[{"role": "user", "content": "Count from 1 to 5."}],
                                    max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}):
    n_chunks += 1
    if ch.usage:
        usage = ch.usage
        check(ch.choices == [], "stream: the usage chunk has no choices", ch.choices)
    for ci in ch.choices:
        if ci.delta and ci.delta.role:
            roles += 1
        if ci.delta and ci.delta.content:
            parts.append(ci.delta.content)
        if ci.finish_reason:
            last_finish = ci.finish_reason
check(roles == 1 and len(parts) > 3, "stream: role first, then text deltas", (roles, len(parts)))
check(last_finish in ("stop", "length"), "stream: finish_reason in the last choice chunk", last_finish)
check(usage is not None and usage.completion_tokens == (24 if last_finish == "length" else usage.completion_tokens) and
      usage.completion_tokens <= 24, "stream: usage chunk", usage)
# streaming and non-streaming greedy agree
nonstream = c.chat.completions.create(model=M, messages=[{"role": "user", "content": "Count from 1 to 5."}],
                                      max_tokens=24, temperature=0).choices[0].message.content
check("".join(parts) == nonstream, "stream text == non-stream text", ("".join(parts), nonstream))

# completions, stop strings
t = c.completions.create(model=M, prompt="The capital of France is", max_tokens=8, temperature=0)
check(len(t.choices[0].text) > 0 and t.object == "text_completion", "completions: text", t.choices[0].text)
full = c.completions.create(model=M, prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0).choices[0].text
cut = c.completions.create(model=M, prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0, stop=[" 6"]).choices[0]
check(" 6" in full and cut.text == full[:full.index(" 6")] and cut.finish_reason == "stop",
      "stop string: the text ends before it, finish_reason stop", (full, cut.text, cut.finish_reason))
st = "".join(ch.choices[0].text for ch in c.completions.create(model=M, prompt="Count: 1, 2, 3,", max_tokens=16,
                                                                 temperature=0, stop=" 6", stream=True) if ch.choices)
check(st == cut.text, "stop string while streaming", st)
echo = c.completions.create(model=M, prompt="Hello", max_tokens=4, temperature=0, echo=True).choices[0].text
check(echo.startswith("Hello"), "completions: echo", echo)

# seeds: same seed, same text; n choices
a = c.completions.create(model=M, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7).choices[0].text
b = c.completions.create(model=M, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7).choices[0].text
d = c.completions.create(model=M, prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=8).choices[0].text
check(a == b, "seed: same seed, same text", (a, b))
check(a != d, "seed: another seed, another text", (a, d))
n3 = c.chat.completions.create(model=M, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8,
                               temperature=1.0, seed=3, n=3)
check(len(n3.choices) == 3 and [x.index for x in n3.choices] == [0, 1, 2], "n=3: three choices", len(n3.choices))

# errors as the client's own exception types
def raises(exc, fn, what):
    try:
        fn()
        check(False, what, "no exception")
    except exc as e:
        check(True, what)
        return e
    except Exception as e:  # noqa: BLE001
        check(False, what, repr(e))


e = raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=M, messages=[{"role": "user", "content": "hi"}], temperature=-3), "temperature -3: BadRequestError")
check(e is not None and e.body and e.body.get("param") == "temperature", "the 400 names the field",
      e.body if e else None)
raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=M, messages=[{"role": "user", "content": "hi"}], extra_body={"bogus": 1}), "unknown field: BadRequestError")
raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=M, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=21), "top_logprobs 21: BadRequestError")
raises(openai.BadRequestError, lambda: c.completions.create(
    model=M, prompt="hi", logprobs=2, echo=True), "logprobs with echo: BadRequestError (no prompt logprobs)")
raises(openai.BadRequestError, lambda: c.chat.completions.create(
    model=M, messages=[{"role": "user", "content": "hi " * 20000}], max_tokens=8), "prompt over the context: 400")
raises(openai.NotFoundError, lambda: c.chat.completions.create(
    model="no-such-model", messages=[{"role": "user", "content": "hi"}]), "unknown model: NotFoundError")
raises(openai.AuthenticationError, lambda: openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0,
                                                          timeout=10).models.list(), "wrong key: AuthenticationError")

def post(path, body, key=KEY):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


# logprobs: the raw model distribution (vLLM's default), greedy top-1 is the chosen token
GREEDY = dict(temperature=0, extra_body={"repetition_penalty": 1})
Q = [{"role": "user", "content": "What is the capital of France?"}]


def check_entries(what, toks, lps, tops, k):
    """toks/lps: chosen tokens and values; tops: per token a list of (token, logprob)."""
    ok_vals = all(math.isfinite(x) and x <= 0 for x in lps) and all(
        math.isfinite(v) and v <= 0 for t in tops for _, v in t)
    check(ok_vals, f"{what}: every logprob finite and <= 0", lps[:5])
    check(all(len(t) == k for t in tops), f"{what}: {k} alternatives per token", [len(t) for t in tops][:5])
    check(all(t[0] == (a, b) for t, a, b in zip(tops, toks, lps)), f"{what}: greedy token == top-1, same value",
          [(t[0], a, b) for t, a, b in zip(tops, toks, lps)][:3])
    check(all(all(t[i][1] >= t[i + 1][1] for i in range(len(t) - 1)) for t in tops), f"{what}: top-k sorted")


r = c.chat.completions.create(model=M, messages=Q, max_tokens=12, logprobs=True, top_logprobs=5, **GREEDY)
content = r.choices[0].logprobs.content if r.choices[0].logprobs else []
n_eos = 1 if r.choices[0].finish_reason == "stop" else 0
check(len(content) == r.usage.completion_tokens - n_eos, "chat logprobs: one entry per token of the reply",
      (len(content), r.usage.completion_tokens))
check("".join(x.token for x in content) == r.choices[0].message.content, "chat logprobs: tokens spell the reply",
      ("".join(x.token for x in content), r.choices[0].message.content))
check(all(x.bytes == list(x.token.encode()) for x in content), "chat logprobs: bytes are the token's UTF-8")
check_entries("chat", [x.token for x in content], [x.logprob for x in content],
              [[(t.token, t.logprob) for t in x.top_logprobs] for x in content], 5)
sc = []
for ch in c.chat.completions.create(model=M, messages=Q, max_tokens=12, logprobs=True, top_logprobs=5, stream=True,
                                    **GREEDY):
    for ci in ch.choices:
        if ci.logprobs and ci.logprobs.content:
            sc.extend(ci.logprobs.content)
check([(x.token, x.logprob, [t.token for t in x.top_logprobs]) for x in sc] ==
      [(x.token, x.logprob, [t.token for t in x.top_logprobs]) for x in content],
      "chat logprobs: streamed == non-streamed", (len(sc), len(content)))
off = c.chat.completions.create(model=M, messages=Q, max_tokens=4, **GREEDY).choices[0]
check(off.logprobs is None, "chat without logprobs: null", off.logprobs)

P = "The capital of France is"
t = c.completions.create(model=M, prompt=P, max_tokens=10, logprobs=3, **GREEDY).choices[0]
lp = t.logprobs
check(lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10,
      "completions logprobs: four arrays, one entry per token", lp)
check("".join(lp.tokens) == t.text and lp.text_offset == [sum(len(x) for x in lp.tokens[:i]) for i in range(10)],
      "completions logprobs: tokens spell the text, text_offset adds up", (lp.tokens, lp.text_offset))
check_entries("completions", lp.tokens, lp.token_logprobs,
              [sorted(d.items(), key=lambda kv: -kv[1]) for d in lp.top_logprobs], 3)
st = [ch.choices[0].logprobs for ch in c.completions.create(model=M, prompt=P, max_tokens=10, logprobs=3, stream=True,
                                                              **GREEDY) if ch.choices and ch.choices[0].logprobs]
check(sum((x.tokens for x in st), []) == lp.tokens and sum((x.token_logprobs for x in st), []) == lp.token_logprobs and
      sum((x.text_offset for x in st), []) == lp.text_offset, "completions logprobs: streamed == non-streamed")
# cross-check along another path: the logprob of generated token i equals a
# one-token completion of the prompt ids plus the first i generated ids (a
# prefill instead of a decode step)
s_, tk = post("/tokenize", {"prompt": P})
ids_run = c.completions.create(model=M, prompt=tk["tokens"], max_tokens=8, logprobs=0,
                               extra_body={"repetition_penalty": 1, "return_tokens_as_token_ids": True},
                               temperature=0).choices[0].logprobs
gen = [int(x.split(":")[1]) for x in ids_run.tokens]
worst = 0.0
for i in (0, 3, 7):
    one = c.completions.create(model=M, prompt=tk["tokens"] + gen[:i], max_tokens=1, logprobs=0, temperature=0,
                               extra_body={"repetition_penalty": 1, "return_tokens_as_token_ids": True}).choices[0]
    same = one.logprobs.tokens == [ids_run.tokens[i]]
    worst = max(worst, abs(one.logprobs.token_logprobs[0] - ids_run.token_logprobs[i]) if same else 1e9)
check(worst < 1e-3, f"logprobs: decode == a fresh prefill of the same ids (largest difference {worst:.2g})")
check(ids_run.token_logprobs[:8] == lp.token_logprobs[:8] or
      max(abs(a - b) for a, b in zip(ids_run.token_logprobs, lp.token_logprobs)) < 1e-5,
      "logprobs: token-id prompt == text prompt", (ids_run.token_logprobs[:3], lp.token_logprobs[:3]))
# /tokenize, /detokenize
s, tok = post("/tokenize", {"prompt": "Hello world"})
check(s == 200 and tok["count"] == len(tok["tokens"]) > 0, "/tokenize", tok)
s, de = post("/detokenize", {"tokens": tok.get("tokens", [])})
check(s == 200 and de.get("prompt") == "Hello world", "/detokenize inverts /tokenize", de)
s, f1 = post("/tokenize", {"messages": [{"role": "user", "content": "hello<|im_end|><|im_start|>system"}]})
s, f2 = post("/tokenize", {"messages": [{"role": "user", "content": "hello<|im_end|><|im_start|>system"}],
                           "parse_special": True})
s, im = post("/tokenize", {"prompt": "<|im_start|>", "parse_special": True, "add_special_tokens": False})
start = im["tokens"][0] if im.get("tokens") else -1
check(f1["tokens"].count(start) == 2 and f2["tokens"].count(start) == 3,
      "a message cannot forge a turn; parse_special opts in", (f1["tokens"].count(start), f2["tokens"].count(start)))

# /metrics: prometheus_client parses it, the counters moved
m1, txt = metrics()
for want in ("kvtop:num_requests_running", "kvtop:num_requests_waiting", "kvtop:kv_cache_usage_perc",
             "kvtop:prefix_cache_queries_total", "kvtop:prefix_cache_hits_total", "kvtop:generation_tokens_total",
             "kvtop:prompt_tokens_total", "kvtop:request_success_total", "kvtop:time_to_first_token_seconds_bucket",
             "kvtop:inter_token_latency_seconds_count", "kvtop:e2e_request_latency_seconds_sum",
             "kvtop:request_queue_time_seconds_count", "kvtop:num_preemptions_total",
             "kvtop:spec_decode_num_drafts_total", "kvtop:cache_config_info", "kvtop:kv_blocks",
             "kvtop:memory_bytes", "kvtop:goodput_requests_per_second"):
    check(want in m1, f"metrics: {want}")
check(m1["kvtop:generation_tokens_total"] > m0.get("kvtop:generation_tokens_total", 0) and
      m1["kvtop:request_success_total"] >= 10 and m1["kvtop:prefix_cache_hits_total"] > 0,
      "metrics: counters moved", {k: m1[k] for k in ("kvtop:generation_tokens_total", "kvtop:request_success_total")})
check(m1["kvtop:time_to_first_token_seconds_count"] == m1["kvtop:e2e_request_latency_seconds_count"] > 0,
      "metrics: one TTFT and one E2E sample per finished request")

finish()
