/* bench_helpers.h - what the benchmark tests (tests/cli) share: a small
 * greedy closed workload on stories260K for kv_bench_run. Header-only,
 * after harness.h. */
#ifndef KV_TEST_BENCH_HELPERS_H
#define KV_TEST_BENCH_HELPERS_H

#include "../engine/config.h"
#include "harness.h"

/* kv_config's defaults on stories260K of the shared test data, one thread,
 * a 4 MiB KV pool without prefix sharing, at most max_seqs sequences,
 * greedy; a burst of `requests` requests of fixed prompt_len-token
 * prompts that ignore end-of-sequence. A test sets the output lengths,
 * the seed and what else it needs afterwards. */
static inline void test_bench_config(kv_config *c, int max_seqs, int requests, int prompt_len) {
    kv_config_default(c);
    harness_shared_copy(c->model.path, sizeof c->model.path, "models/stories260K.gguf");
    c->threads = 1;
    c->kv.memory = 4u << 20;
    c->kv.prefix_sharing = 0;
    c->scheduler.max_seqs = max_seqs;
    c->sampling.temperature = 0;
    c->workload.requests = requests;
    c->workload.arrival = KV_ARRIVAL_BURST;
    c->workload.prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = prompt_len};
    c->workload.ignore_eos = 1;
}

#endif
