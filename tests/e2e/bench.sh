#!/usr/bin/env bash
# End-to-end checks of `kvtop bench` on stories260K with small workloads (a
# few seconds in all): the JSON figures, --outputs in request order, greedy
# outputs identical across runs and across batch sizes, rejections counted,
# closed-loop concurrency, --compare columns, and clean exit-2 errors.
# Prints "N passed, N failed".
set -u
GOT_CHARS=400
. "$(dirname "$0")/lib/checks.sh"
M=$S/models/stories260K.gguf
T=$tmp
# py FILE EXPR: evaluates a Python expression over d = the JSON in FILE (or
# lines = the JSONL records when FILE ends in .jsonl); exit 0 when true.
py() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
f, expr = sys.argv[1], sys.argv[2]
if f.endswith('.jsonl'):
    lines = [json.loads(l) for l in open(f)]
else:
    d = json.load(open(f))
sys.exit(0 if eval('(' + expr + ')') else 1)
EOF
}

# A small burst workload on the tiny model: fixed lengths, greedy, exact output lengths.
base=(--set model.path="$M" --set threads=1 --set workload.requests=12 --set workload.arrival=burst
      --set workload.prompt_len=20 --set workload.output_len=16 --set workload.ignore_eos=true
      --set sampling.temperature=0 --set kv.memory=4MiB --set scheduler.max_seq_len=512
      --set kv.prefix_sharing=false --set spec.method=off)
P=profiles/default.yaml

out=$($K bench $P "${base[@]}" --set scheduler.max_seqs=8 --json "$T/a.json" --outputs "$T/a.jsonl" 2>&1); rc=$?
if [[ $rc == 0 ]]; then ok "bench runs (exit 0)"; else bad "bench runs (exit $rc)" "$out"; fi
[[ $out == *"output"*"tok/s"* && $out == *TTFT* && $out == *TPOT* && $out == *E2E* && $out == *goodput* && $out == *"KV cache"* ]] \
  && ok "table has throughput, latencies, goodput, KV" || bad "table" "$out"
keys='all(k in d for k in ["output_tokens_per_s","input_tokens_per_s","requests_completed","requests_rejected",
  "goodput_requests_per_s","ttft_ms","tpot_ms","e2e_ms","kv_utilization","prefix_hit_rate","prefix_hit_tokens",
  "prefill_tokens_computed","preemptions","max_concurrent","kv_blocks_total","kv_bytes_per_token",
  "spec_acceptance_rate","spec_mean_accepted_len","model","config"])
  and all(all(q in d[s] for q in ["p50","p90","p99","mean"]) for s in ["ttft_ms","tpot_ms","e2e_ms"])'
py "$T/a.json" "$keys" && ok "JSON has every key" || bad "JSON keys" "$(head -c 300 "$T/a.json")"
sane='d["requests_completed"] == 12 and d["requests_rejected"] == 0 and d["output_tokens"] == 12*16
  and d["input_tokens"] == 12*21 and d["output_tokens_per_s"] > 0 and d["input_tokens_per_s"] > 0
  and 0 < d["ttft_ms"]["p50"] <= d["ttft_ms"]["p90"] <= d["ttft_ms"]["p99"]
  and d["e2e_ms"]["p50"] >= d["ttft_ms"]["p50"] and d["tpot_ms"]["mean"] > 0
  and 0 < d["kv_utilization"] <= 1 and d["kv_bytes_per_token"] == 640
  and d["kv_blocks_total"] == 4*1024*1024 // (640*16) and 1 <= d["max_concurrent"] <= 8
  and d["prefill_tokens_computed"] == 12*21 and d["prefix_hit_tokens"] == 0
  and d["spec_acceptance_rate"] == 0 and d["config"]["scheduler"]["max_seqs"] == 8
  and d["config"]["kv"]["layout"] == "paged" and "max_seqs: 8" in d["config_yaml"]'
py "$T/a.json" "$sane" && ok "JSON figures are sane (counts, percentiles ordered, 640 B/token)" \
  || bad "JSON figures" "$(head -c 1500 "$T/a.json")"

py "$T/a.jsonl" 'len(lines) == 12 and [l["index"] for l in lines] == list(range(12))
  and all(l["prompt_tokens"] == 21 and l["output_tokens"] == 16 and l["finish"] == "length" and l["text"] for l in lines)' \
  && ok "--outputs: one line per request, in order, exact lengths" || bad "--outputs" "$(head -n 3 "$T/a.jsonl")"

$K bench $P "${base[@]}" --set scheduler.max_seqs=8 --outputs "$T/b.jsonl" --quiet >"$T/b.out" 2>&1
cmp -s "$T/a.jsonl" "$T/b.jsonl" && ok "greedy outputs identical between two runs" || bad "two runs differ" "$(diff "$T/a.jsonl" "$T/b.jsonl" | head -n 4)"
[[ ! -s $T/b.out ]] && ok "--quiet prints nothing" || bad "--quiet printed" "$(cat "$T/b.out")"
$K bench $P "${base[@]}" --set scheduler.max_seqs=1 --outputs "$T/c.jsonl" --json "$T/c.json" --quiet
cmp -s "$T/a.jsonl" "$T/c.jsonl" && ok "greedy outputs identical with max_seqs 1 and 8 (batch invariance)" \
  || bad "max_seqs 1 vs 8 differ" "$(diff "$T/a.jsonl" "$T/c.jsonl" | head -n 4)"
py "$T/c.json" 'd["max_concurrent"] == 1' && ok "max_seqs=1 runs one at a time" || bad "max_seqs=1 max_concurrent" "$(grep max_concurrent "$T/c.json")"

# Sampled outputs are reproducible too (seed per request = sampling.seed + index).
$K bench $P "${base[@]}" --set sampling.temperature=0.9 --set sampling.seed=5 --outputs "$T/s1.jsonl" --quiet
$K bench $P "${base[@]}" --set sampling.temperature=0.9 --set sampling.seed=5 --set scheduler.max_seqs=3 --outputs "$T/s2.jsonl" --quiet
cmp -s "$T/s1.jsonl" "$T/s2.jsonl" && ! cmp -s "$T/s1.jsonl" "$T/a.jsonl" && ok "seeded sampling reproducible across batch sizes" \
  || bad "seeded sampling" "$(diff "$T/s1.jsonl" "$T/s2.jsonl" | head -n 4)"

# Requests that can never fit are rejected, counted, and the run goes on:
# every third prompt of this file is longer than the 64-token context.
long=$(printf 'and the dog ran far away %.0s' $(seq 1 20))
for i in 0 1 2 3; do printf '{"prompt": "Once upon a time"}\n{"prompt": "Lily saw a cat"}\n{"prompt": "%s"}\n' "$long"; done >"$T/p.jsonl"
out=$($K bench $P "${base[@]}" --set scheduler.max_seq_len=64 --set workload.prompts_file="$T/p.jsonl" \
      --json "$T/r.json" --outputs "$T/r.jsonl" 2>&1); rc=$?
[[ $rc == 0 ]] && py "$T/r.json" 'd["requests_rejected"] == 4 and d["requests_completed"] == 8' \
  && py "$T/r.jsonl" 'len(lines) == 12 and all((l["finish"] == "rejected") == (i % 3 == 2) for i, l in enumerate(lines))
  and all(l["reason"] for l in lines if l["finish"] == "rejected") and lines[0]["prompt_tokens"] < 10' \
  && ok "over-long prompts rejected with a reason, the rest complete" || bad "rejections" "$out $(head -c 600 "$T/r.jsonl")"

# Closed loop keeps at most `concurrency` in flight; poisson arrivals are paced.
$K bench $P "${base[@]}" --set workload.arrival=closed --set workload.concurrency=3 --json "$T/cl.json" --quiet
py "$T/cl.json" 'd["requests_completed"] == 12 and 1 <= d["max_concurrent"] <= 3' && ok "closed loop: at most 3 in flight" \
  || bad "closed loop" "$(grep -E 'max_concurrent|requests_completed' "$T/cl.json")"
$K bench $P "${base[@]}" --set workload.arrival=poisson --set workload.rate=40 --set workload.requests=8 --json "$T/po.json" --quiet
py "$T/po.json" 'd["requests_completed"] == 8 and d["wall_s"] > 0.05' && ok "poisson arrivals paced on the wall clock" \
  || bad "poisson" "$(grep -E 'wall_s|requests_completed' "$T/po.json")"

# --compare: one column per value, ratios to the first, JSON runs, one outputs file per run.
out=$($K bench $P "${base[@]}" --compare scheduler.policy=continuous,static --json "$T/cmp.json" --outputs "$T/cmp.jsonl" 2>/dev/null); rc=$?
hdr=$(echo "$out" | grep -E '^scheduler.policy ')
[[ $rc == 0 && $hdr == *continuous*static* && $out == *"output tok/s"*"x)"* ]] && ok "--compare prints the two columns with ratios" \
  || bad "--compare table" "$out"
py "$T/cmp.json" 'd["compare"] == "scheduler.policy" and [r["value"] for r in d["runs"]] == ["continuous", "static"]
  and all(r["requests_completed"] == 12 for r in d["runs"]) and d["runs"][1]["config"]["scheduler"]["policy"] == "static"' \
  && ok "--compare JSON has both runs" || bad "--compare JSON" "$(head -c 300 "$T/cmp.json")"
cmp -s "$T/cmp-continuous.jsonl" "$T/cmp-static.jsonl" && cmp -s "$T/cmp-continuous.jsonl" "$T/a.jsonl" \
  && ok "--compare --outputs: one file per run, same greedy text under both policies" || bad "--compare outputs" "$(ls "$T")"

# The sim backend's clock: an open-loop workload at 1 request/s spreads its
# arrivals over ~7 s of engine time, which the driver skips instead of
# waiting for (the clock is the simulated device's); the same greedy text as
# the cpu backend; tokens per simulated second reported.
sim=(--set workload.arrival=poisson --set workload.rate=1 --set workload.requests=8)
out=$($K bench $P "${base[@]}" "${sim[@]}" --set backend=sim --json "$T/sim.json" --outputs "$T/sim.jsonl" 2>&1); rc=$?
[[ $rc == 0 && $out == *"sim device"* ]] && ok "bench on the sim backend" || bad "bench on sim (exit $rc)" "$out"
py "$T/sim.json" 'd["elapsed_s"] > 1.0 and d["wall_s"] < 0.5 * d["elapsed_s"] and 0 < d["sim_device_s"] < d["elapsed_s"]
  and d["sim_output_tokens_per_s"] > 0 and d["requests_completed"] == 8' \
  && ok "sim clock: arrivals on engine time, idle time skipped, device time reported" \
  || bad "sim clock" "$(head -c 600 "$T/sim.json")"
$K bench $P "${base[@]}" "${sim[@]}" --set backend=cpu --outputs "$T/simcpu.jsonl" >/dev/null 2>&1
cmp -s "$T/sim.jsonl" "$T/simcpu.jsonl" && ok "sim backend: the cpu backend's greedy text" || bad "sim vs cpu text" "$(head -c 300 "$T/sim.jsonl")"

# Errors: exit 2 and a message naming the key, the file position or the option; nothing runs.
out=$($K bench $P "${base[@]}" --set kv.blok_size=16 --json "$T/e.json" 2>&1); rc=$?
[[ $rc == 2 && $out == *kv.blok_size* && ! -e $T/e.json ]] && ok "unknown --set key: exit 2, names the key" || bad "bad --set key (exit $rc)" "$out"
out=$($K bench $P "${base[@]}" --set scheduler.max_seqs=banana 2>&1); rc=$?
[[ $rc == 2 && $out == *scheduler.max_seqs* ]] && ok "bad --set value: exit 2, names the key" || bad "bad --set value (exit $rc)" "$out"
out=$($K bench $P "${base[@]}" --compare scheduler.policy=continuous,sideways 2>&1); rc=$?
[[ $rc == 2 && $out == *scheduler.policy* && $out == *sideways* && $out != *"tok/s"* ]] \
  && ok "bad --compare value: exit 2 before any run" || bad "bad --compare value (exit $rc)" "$out"
printf 'kv:\n  block_size: 16\n  bogus: 3\n' >"$T/bad.yaml"
out=$($K bench "$T/bad.yaml" 2>&1); rc=$?
[[ $rc == 2 && $out == *bad.yaml:3:* ]] && ok "bad profile: exit 2 with file:line:column" || bad "bad profile (exit $rc)" "$out"
out=$($K bench "$T/none.yaml" 2>&1); rc=$?
[[ $rc == 2 && $out == *none.yaml* ]] && ok "missing profile: exit 2" || bad "missing profile (exit $rc)" "$out"
out=$($K bench $P "${base[@]}" --set workload.prompts_file="$T/nope.jsonl" 2>&1); rc=$?
[[ $rc == 2 && $out == *nope.jsonl* ]] && ok "missing prompts file: exit 2" || bad "missing prompts file (exit $rc)" "$out"
out=$($K bench $P --frobnicate 2>&1); rc=$?
[[ $rc == 2 && $out == *frobnicate* ]] && ok "unknown option: exit 2" || bad "unknown option (exit $rc)" "$out"
out=$($K bench $P "${base[@]}" --set model.path="$T/missing.gguf" 2>&1); rc=$?
[[ $rc == 1 && $out == *missing.gguf* ]] && ok "missing model: exit 1, names the file" || bad "missing model (exit $rc)" "$out"

# --json / --outputs never destroy an input: the model, the profile, a
# symbolic link to the model, the prompts file and a draft model are refused
# by inode (exit 2, the file byte for byte as it was).
cp "$M" "$T/m.gguf"; cp "$M" "$T/d.gguf"; cp $P "$T/prof.yaml"; ln -s "$T/m.gguf" "$T/mlink"
own=("${base[@]}" --set model.path="$T/m.gguf" --set workload.requests=2)
refused() { # LABEL FILE ORIGINAL ARGS...: bench refuses and FILE is unchanged, no FILE.tmp left
  local label=$1 f=$2 orig=$3; shift 3
  out=$($K bench "$@" 2>&1); rc=$?
  [[ $rc == 2 && $out == *"refusing to overwrite"* ]] && cmp -s "$f" "$orig" && [[ ! -e $f.tmp ]] \
    && ok "$label" || bad "$label (exit $rc, $(stat -c %s "$f") bytes)" "$out"
}
refused "--json onto the model is refused" "$T/m.gguf" "$M" $P "${own[@]}" --json "$T/m.gguf"
refused "--outputs onto the model is refused" "$T/m.gguf" "$M" $P "${own[@]}" --outputs "$T/m.gguf"
refused "--json onto a link to the model is refused" "$T/m.gguf" "$M" $P "${own[@]}" --json "$T/mlink"
refused "--json onto the profile is refused" "$T/prof.yaml" $P "$T/prof.yaml" "${own[@]}" --json "$T/prof.yaml"
cp "$T/p.jsonl" "$T/p.orig"
refused "--outputs onto the prompts file is refused" "$T/p.jsonl" "$T/p.orig" $P "${own[@]}" \
  --set workload.prompts_file="$T/p.jsonl" --outputs "$T/p.jsonl"
refused "--json onto the draft model is refused" "$T/d.gguf" "$M" $P "${own[@]}" --set spec.method=draft_model \
  --set spec.draft_model="$T/d.gguf" --json "$T/d.gguf"
out=$($K bench $P "${own[@]}" --json "$T/same" --outputs "$T/same" 2>&1); rc=$?
[[ $rc == 2 && $out == *"another output"* && ! -e $T/same ]] && ok "--json and --outputs on one file: refused" \
  || bad "--json == --outputs (exit $rc)" "$out"

# A run that fails leaves an earlier result as it was (no FILE.tmp either);
# with --compare a,b where b fails, a's results are written and b is marked
# with its error, exit 1.
$K bench $P "${own[@]}" --json "$T/keep.json" --outputs "$T/keep.jsonl" --quiet
cp "$T/keep.json" "$T/keep.json.orig"; cp "$T/keep.jsonl" "$T/keep.jsonl.orig"
for why in "--set backend=sim --set sim_device=nosuchgpu" "--set model.path=$T/missing.gguf"; do
  out=$($K bench $P "${own[@]}" $why --json "$T/keep.json" --outputs "$T/keep.jsonl" --quiet 2>&1); rc=$?
  [[ $rc == 1 && -s $T/keep.json ]] && cmp -s "$T/keep.json" "$T/keep.json.orig" && cmp -s "$T/keep.jsonl" "$T/keep.jsonl.orig" \
    && [[ ! -e $T/keep.json.tmp && ! -e $T/keep.jsonl.tmp ]] \
    && ok "a failed run ($why) leaves the earlier --json and --outputs as they were" \
    || bad "failed run ($why) kept earlier results (exit $rc)" "$out $(ls "$T" | grep keep)"
done
out=$($K bench $P "${own[@]}" --set backend=sim --compare sim_device=h100,nosuchgpu --json "$T/half.json" \
      --outputs "$T/half.jsonl" --quiet 2>&1); rc=$?
[[ $rc == 1 && $out == *nosuchgpu* ]] && py "$T/half.json" 'd["failed_runs"] == 1 and d["runs"][0]["value"] == "h100"
  and d["runs"][0]["requests_completed"] == 2 and "error" not in d["runs"][0]
  and d["runs"][1]["value"] == "nosuchgpu" and "nosuchgpu" in d["runs"][1]["error"]' \
  && py "$T/half-h100.jsonl" 'len(lines) == 2' && [[ ! -e $T/half-nosuchgpu.jsonl && ! -e $T/half-nosuchgpu.jsonl.tmp ]] \
  && ok "--compare a,b with b failing: a's results written, b marked with its error, exit 1" \
  || bad "--compare with a failing value (exit $rc)" "$out $(head -c 600 "$T/half.json")"

# Interrupted (SIGTERM, SIGINT) while it runs: FILE.tmp is removed and an
# earlier FILE stays as it was.
for sig in TERM INT; do
  cp "$T/keep.json.orig" "$T/sig.json"
  $K bench $P "${own[@]}" --set workload.requests=200000 --set workload.output_len=1 --json "$T/sig.json" \
    --quiet >/dev/null 2>&1 & bp=$!
  for _ in $(seq 1 500); do [[ -e $T/sig.json.tmp ]] && break; sleep 0.02; done
  seen=0; [[ -e $T/sig.json.tmp ]] && seen=1
  sleep 0.2
  kill -$sig $bp 2>/dev/null; wait $bp 2>/dev/null; rc=$?
  [[ $seen == 1 && $rc -gt 128 && ! -e $T/sig.json.tmp ]] && cmp -s "$T/sig.json" "$T/keep.json.orig" \
    && ok "bench interrupted by SIG$sig: no FILE.tmp left, the earlier FILE kept" \
    || bad "bench SIG$sig (seen $seen, rc $rc)" "$(ls "$T" | grep sig)"
done

# tools/burst_curve.sh (the README's burst table) runs: one row per size,
# every request of the burst completed.
out=$(KVTOP_BIN=$K KVTOP_SHARED=$S bash tools/burst_curve.sh 200 400 2>&1); rc=$?
[[ $rc == 0 && $(echo "$out" | grep -cE '^\| (200|400) \| [0-9.]+ \|') == 2 ]] && ok "tools/burst_curve.sh: a row per burst size" \
  || bad "tools/burst_curve.sh (exit $rc)" "$out"

echo "$pass passed, $fail failed"
