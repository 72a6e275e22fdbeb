/* tour.c - `kvtop tour`: a guided demo for a lecture or a booth. Each
 * station is one comparison running side by side (compare.c) with a
 * one-line caption saying what to watch; F12 (or n on the panels) goes on
 * to the next, F11 (b) back. The stations follow the seed's order: prefill
 * against decode, batching, paging, prefix sharing, quantized KV,
 * speculation, and the failure modes with their guards. Every station's
 * comparison is one of the demo profiles' own (their README lines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "tui.h"

static const kv_tour_station stations[] = {
    {"prefill vs decode", "profiles/demo-paging.yaml", "scheduler.prefill_chunk=512,16",
     "a step runs prompt tokens (prefill, p in Sched) beside one token per running request (decode, d); "
     "B cuts prompts into 16-token chunks: more steps carry prefill, TTFT and TPOT both grow"},
    {"batching", "profiles/demo-batching.yaml", "scheduler.policy=continuous,static",
     "continuous batching admits a request the step a slot frees; static waits for the whole batch to end: "
     "watch B's running count drain between batches, and its out tok/s"},
    {"paging", "profiles/demo-paging.yaml", "kv.layout=paged,contiguous",
     "contiguous reserves max_seq_len slots per request: long runs of empty blocks (blank marks), few running; "
     "paged hands out a block as tokens arrive: full blocks, ~10x more running"},
    {"prefix sharing", "profiles/demo-prefix.yaml", "kv.prefix_sharing=true,false",
     "64 requests share a 512-token system prompt: A keeps one copy (shared blocks, prefill tokens fall), "
     "B computes and stores it for every request"},
    {"quantized KV", "profiles/demo-quant.yaml", "kv.dtype=f16,int8",
     "one memory budget: int8 K/V take ~half the bytes of f16, so B's cache has ~1.9x the blocks and runs "
     "about twice the requests at once (f16 queues half of them)"},
    {"speculation", "profiles/demo-spec.yaml", "spec.method=off,ngram",
     "n-gram prompt lookup drafts tokens the prompt already holds; the target checks them in one forward: "
     "B's TPOT falls where drafts are accepted"},
    {"failure mode: a bad draft", "profiles/demo-spec-slow.yaml", "spec.adaptive=false,true",
     "a self-speculative draft (4 of 30 layers) that rarely agrees makes decoding slower than none; B's "
     "adaptive guard falls back to plain decode while acceptance stays low"},
    {"failure mode: KV cascade", "profiles/demo-kv-cascade.yaml", "scheduler.admission=greedy,max_tokens",
     "A admits on prompt blocks only: answers outgrow the pool, each preemption's victim returns and preempts "
     "the next (Sched: cascades, tokens recomputed); B reserves max_tokens: fewer run, nothing is redone"},
    {"failure mode: starvation", "profiles/demo-starvation.yaml", "scheduler.order=fcfs,short_first",
     "short interactive requests queue behind long ones under FCFS (Sched: TTFT by job size, short close to "
     "long); B lets the short ones take the next free slot"},
    {"failure mode: latency", "profiles/demo-latency-tradeoff.yaml", "scheduler.max_seqs=64,auto",
     "a batch of 64 shares each step but every token waits for the whole step (TPOT far over the 3 ms SLA); "
     "B sizes the batch from measured step times to hold it (Sched: batch cap N)"},
};

const kv_tour_station *kv_tour_stations(int *n) {
    *n = (int)(sizeof stations / sizeof stations[0]);
    return stations;
}

int cmd_tour(int argc, char **argv) {
    int n;
    const kv_tour_station *st = kv_tour_stations(&n);
    long first = 1, frames = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        char *end = NULL;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            printf("usage: kvtop tour [--station N] [--frames N]\n"
                   "  a guided demo: each station runs one comparison side by side with a caption;\n"
                   "  F12 (n on the panels) next station, F11 (b) back, F9 fill/owner marks, ^C quit.\n"
                   "  --list   prints the stations and exits\n");
            return 0;
        } else if (!strcmp(s, "--list")) {
            for (int k = 0; k < n; k++)
                printf("%d. %-26s kvtop %s --compare %s\n   %s\n", k + 1, st[k].title, st[k].profile, st[k].compare,
                       st[k].caption);
            return 0;
        } else if (!strcmp(s, "--station") && i + 1 < argc) {
            first = strtol(argv[++i], &end, 10);
            if (*end || first < 1 || first > n) {
                fprintf(stderr, "kvtop tour: --station needs a number in [1, %d], got '%s'\n", n, argv[i]);
                return 2;
            }
        } else if (!strcmp(s, "--frames") && i + 1 < argc) {
            frames = strtol(argv[++i], &end, 10);
            if (*end || frames < 1 || frames > 100000000) {
                fprintf(stderr, "kvtop tour: --frames needs a positive number, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "kvtop tour: unexpected argument '%s' (see --help)\n", s);
            return 2;
        }
    }
    static app A; /* large: not on the stack */
    memset(&A, 0, sizeof A);
    kv_config_default(&A.cfg);
    A.max_frames = (uint64_t)frames;
    A.zoom = -1;
    return cmp_main(&A, NULL, NULL, 0, NULL, st, n, (int)first - 1);
}
