#!/usr/bin/env bash
# End-to-end checks of issue 17's demo profiles through `kvtop bench` on
# stories260K (about 20 s in all on a quiet machine): the KV cascade demo's JSON counts
# preemption chains and recomputed tokens and its max_tokens guard removes
# them with identical greedy outputs; the starvation demo reports TTFT per
# class and short_first cuts the short class's; the latency demo's target
# TPOT caps the batch; max_seqs auto holds an SLA's TPOT where a fixed
# batch does not (backend sim: step times from the device model, the same
# every run); the TUI's Sched panel shows the TTFT-by-class line (tmux);
# bad guard values are refused naming the key. Prints "N passed, N failed".
set -u
TMUX_NAME=fd
. "$(dirname "$0")/lib/tmux.sh"
M=$S/models/stories260K.gguf
T=$tmp
py() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; }
if [[ ! -f $M ]]; then echo "  (skipped: $M not present)"; echo "0 passed, 0 failed"; exit 0; fi
m=(--set model.path="$M" --set threads=1)

P=profiles/demo-kv-cascade.yaml
out=$($K bench $P "${m[@]}" --set scheduler.max_wait_ms=0 --json "$T/c.json" --outputs "$T/c.jsonl" 2>&1); rc=$?
[[ $rc == 0 ]] && ok "cascade demo runs" || bad "cascade demo (exit $rc)" "$out"
py "$T/c.json" 'd["preemption_chains"] >= 2 and d["longest_preemption_chain"] >= 3 and 0 < d["tokens_recomputed"] <= d["tokens_discarded"]' \
  && ok "cascade JSON: preemption_chains, longest chain, tokens recomputed" || bad "cascade JSON" "$(head -c 600 "$T/c.json")"
[[ $out == *"cascades"*"computed again"* ]] && ok "cascade table line" || bad "cascade table line" "$out"
out=$($K bench $P "${m[@]}" --set scheduler.max_wait_ms=0 --set scheduler.admission=max_tokens --json "$T/g.json" \
      --outputs "$T/g.jsonl" 2>&1); rc=$?
[[ $rc == 0 ]] && py "$T/g.json" 'd["preemptions"] == 0 and d["tokens_recomputed"] == 0 and d["preemption_chains"] == 0' \
  && ok "max_tokens admission: no preemption" || bad "max_tokens admission" "$out"
cmp -s "$T/c.jsonl" "$T/g.jsonl" && ok "guard leaves greedy outputs identical" || bad "outputs differ under the guard"
out=$($K bench $P "${m[@]}" --compare scheduler.preempt_victim=newest,least_work 2>&1); rc=$?
[[ $rc == 0 && $out == *"tokens recomputed"* && $out == *"preemption cascades"* && $out == *"longest chain"* ]] \
  && ok "--compare rows for the cascade" || bad "--compare rows" "$out"

P=profiles/demo-starvation.yaml
out=$($K bench $P "${m[@]}" --set workload.requests=18 --compare scheduler.order=fcfs,short_first \
      --json "$T/s.json" 2>&1); rc=$?
[[ $rc == 0 && $out == *"TTFT p99 short ms"* && $out == *"TTFT p99 long ms"* ]] && ok "starvation compare rows" \
  || bad "starvation compare (exit $rc)" "$out"
py "$T/s.json" '[a["short"]["n"] > 0 and a["long"]["n"] > 0 and b["short"]["p99"] < a["short"]["p99"] / 2 for a, b in [(d["runs"][0]["ttft_ms_by_class"], d["runs"][1]["ttft_ms_by_class"])]][0]' \
  && ok "short_first: short TTFT p99 under half of FCFS's" || bad "short_first TTFT" "$(head -c 600 "$T/s.json")"

P=profiles/demo-latency-tradeoff.yaml
out=$($K bench $P "${m[@]}" --set workload.requests=64 --set scheduler.target_tpot_ms=0.01 --json "$T/l.json" 2>&1); rc=$?
[[ $rc == 0 ]] && py "$T/l.json" 'd["batch_cap"] == 1 and d["max_concurrent"] <= 2' \
  && ok "an unreachable TPOT target caps the batch at 1" || bad "target_tpot_ms" "$out $(head -c 300 "$T/l.json")"
[[ $out == *"batch size"*"target TPOT"* ]] && ok "batch size table line" || bad "batch size line" "$out"

# max_seqs auto on the simulated H100 (deterministic): with sla.tpot_ms 9 a
# fixed 128 runs at TPOT p50 ~10.6 ms, auto holds 9 and beats the largest
# fixed size under it (32) on throughput
out=$($K bench profiles/sim-batching-variance.yaml --set workload.requests=128 --set sla.tpot_ms=9 \
      --compare scheduler.max_seqs=32,128,auto --json "$T/auto.json" 2>&1); rc=$?
[[ $rc == 0 ]] && py "$T/auto.json" '[f32["tpot_ms"]["p50"] <= 9 and f128["tpot_ms"]["p50"] > 9.5 and a["tpot_ms"]["p50"] <= 9 and a["tpot_ms"]["p99"] <= 9.5 and a["output_tokens_per_s"] > 1.05 * f32["output_tokens_per_s"] and 32 < a["max_concurrent"] < 128 and abs(a["batch_goal_ms"] - 9) < 1e-9 for f32, f128, a in [d["runs"]]][0]' \
  && ok "max_seqs auto holds the SLA's TPOT where 128 does not, above 32's throughput" \
  || bad "max_seqs auto on sim" "$out"
out=$($K bench profiles/sim-batching-variance.yaml --set workload.requests=64 --set scheduler.max_seqs=auto \
      --set sla.tpot_ms=0 2>&1); rc=$?
[[ $rc == 0 && $out == *"max_seqs auto, twice one sequence's fitted step: holds "*" ms a step"* ]] \
  && ok "auto without a target: twice one sequence's step" || bad "auto without a target" "$out"

# The TUI: the starvation demo's Sched panel splits TTFT by job size
tm new-session -d -s fd -x 200 -y 50 "env LANG=C.UTF-8 LC_ALL=C.UTF-8 $K profiles/demo-starvation.yaml ${m[*]} \
  --set workload.requests=24; sleep 30"
if wait_for 'Sched .* continuous' 15; then
  sleep 1
  tm send-keys -t fd F5
  if wait_for 'TTFT by job size: short \(<= 2[0-9] tok\) mean [0-9.]+m?s max [0-9.]+m?s +\| long \(<= [0-9]+ tok\) mean [0-9.]+m?s' 40; then
    ok "TUI: TTFT by job size, short and long"
  else
    bad "TUI: TTFT by job size line" "$(cap fd)"
  fi
else
  bad "TUI: the starvation demo comes up" "$(cap fd)"
fi
tm kill-session -t fd 2>/dev/null

for s in scheduler.watermark=0.95 scheduler.admission=maybe scheduler.admission_quantile=0 scheduler.preempt_victim=oldest \
         scheduler.order=lifo scheduler.target_tpot_ms=-1 workload.short_fraction=2 scheduler.max_seqs=0 \
         scheduler.max_seqs=automatic; do
  out=$($K bench profiles/demo-kv-cascade.yaml "${m[@]}" --set "$s" 2>&1); rc=$?
  [[ $rc == 2 && $out == *"${s%%=*}"* ]] && ok "bad $s refused (exit 2, names the key)" || bad "bad $s (exit $rc)" "$out"
done
finish
