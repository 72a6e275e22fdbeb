/* fuzz_trace.c - libFuzzer target for the TUI's trace-file loader (`kvtop
 * replay FILE`, format 2): any input is either rejected with a message or
 * loads into frames that materialise (forward, backward, at random) into
 * snapshots whose arrays, block tables and step/decision windows can be
 * walked and exported without touching memory outside them. The trace
 * code lives in engine/ and comes from the fuzz library. Seeds: tests/fuzz/gen_seeds_trace.c. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../engine/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t walk(const kv_snapshot *s) {
    uint64_t sink = 0; /* wraps: file-controlled values */
    for (int r = 0; r < s->n_requests; r++) {
        const kv_snap_request *q = &s->requests[r];
        for (int b = 0; b < q->n_blocks; b++) sink += (uint64_t)s->tables[q->table_offset + b];
        sink += (uint64_t)strlen(q->wait_reason);
    }
    for (int i = 0; i < s->n_running; i++) sink += (uint64_t)s->running[i];
    for (int i = 0; i < s->n_waiting; i++) sink += (uint64_t)s->waiting[i];
    for (int i = 0; i < s->n_swapped; i++) sink += (uint64_t)s->swapped[i];
    for (int b = 0; b < s->n_blocks && s->blocks; b++) sink += (uint64_t)s->blocks[b].session;
    for (int i = 0; i < s->n_steps; i++) sink += (uint64_t)s->steps[i].step;
    for (int d = 0; d < s->n_decisions; d++) sink += (uint64_t)strlen(s->decisions[d].text);
    sink += (uint64_t)strlen(s->model_name) + (int64_t)strlen(s->backend);
    return sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f) return 0;
    kv_err err = {0};
    kv_trace *t = kv_trace_load_stream(f, "fuzz", &err);
    fclose(f);
    if (!t) {
        if (err.code == 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    volatile uint64_t sink = 0;
    int n = kv_trace_n_frames(t);
    for (int i = 0; i < n; i++) sink += walk(kv_trace_frame(t, i));
    /* backward (from keyframes) and a scattered order */
    for (int i = n - 1; i >= 0 && i >= n - 130; i--) sink += walk(kv_trace_frame(t, i));
    for (int k = 0; k < 64 && n > 0; k++) sink += walk(kv_trace_frame(t, (int)((k * 2654435761u) % (unsigned)n)));
    if (kv_trace_frame(t, n) || kv_trace_frame(t, -1)) __builtin_trap();
    /* Export to nowhere: the writer must cope with any loaded content. */
    kv_trace_export_chrome(t, "/dev/null", &err);
    kv_trace_free(t);
    (void)sink;
    return 0;
}
