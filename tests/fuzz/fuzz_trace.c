/* fuzz_trace.c - libFuzzer target for the TUI's trace-file loader (`kvtop
 * replay FILE`): any input is either rejected with a message or loads into
 * frames whose arrays and block tables can be walked and exported without
 * touching memory outside them. The trace code lives in tui/ (not in the
 * fuzz link line), so it is compiled in here. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../tui/trace.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    volatile int64_t sink = 0;
    for (int i = 0; i < kv_trace_n_frames(t); i++) {
        const kv_snapshot *s = kv_trace_frame(t, i);
        for (int r = 0; r < s->n_requests; r++) {
            const kv_snap_request *q = &s->requests[r];
            for (int b = 0; b < q->n_blocks; b++) sink += s->tables[q->table_offset + b];
            sink += (int64_t)strlen(q->wait_reason);
        }
        for (int b = 0; b < s->n_blocks && s->blocks; b++) sink += s->blocks[b].session;
        for (int d = 0; d < s->n_decisions; d++) sink += (int64_t)strlen(s->decisions[d].text);
        sink += (int64_t)strlen(s->model_name);
    }
    /* Export to nowhere: the writer must cope with any loaded content. */
    kv_trace_export_chrome(t, "/dev/null", &err);
    kv_trace_free(t);
    (void)sink;
    return 0;
}
