/* test_trace.c - trace files: frames written and read back field for field,
 * an unchanged step not written twice, truncated and foreign files
 * rejected, and the Chrome trace-event export parsed back as JSON with each
 * step, decision and request exactly once. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../../engine/json.h"
#include "../../tui/trace.h"

/* A small snapshot at step `step` with two requests and a 6-block map. */
typedef struct fake {
    kv_snapshot s;
    kv_snap_request req[2];
    int32_t tables[3];
    int64_t running[1], waiting[1];
    kv_snap_block blocks[6];
    kv_step_record steps[2];
    kv_decision dec[2];
} fake;

static void make(fake *f, uint64_t step) {
    memset(f, 0, sizeof *f);
    kv_snapshot *s = &f->s;
    s->step = step;
    s->now_ms = 10.0 * (double)step;
    snprintf(s->model_name, sizeof s->model_name, "stories260K");
    s->block_size = 16;
    s->n_blocks = 6;
    s->blocks_used = 3;
    s->blocks_free = 3;
    for (int i = 0; i < 2; i++) {
        kv_snap_request *q = &f->req[i];
        q->id = 1 + i;
        q->session = i;
        q->state = i == 0 ? KV_REQ_RUNNING : KV_REQ_WAITING;
        q->n_prompt = 5;
        q->n_generated = (int)step;
        q->arrival_ms = 1.0;
        q->ttft_ms = -1;
        q->e2e_ms = -1;
        q->table_offset = 0;
        q->n_blocks = i == 0 ? 3 : 0;
        snprintf(q->wait_reason, sizeof q->wait_reason, i ? "3 free blocks, needs 9" : "");
    }
    f->tables[0] = 0, f->tables[1] = 1, f->tables[2] = 4;
    f->running[0] = 1;
    f->waiting[0] = 2;
    for (int i = 0; i < 6; i++) f->blocks[i].session = -1, f->blocks[i].owner = -1;
    f->blocks[0].state = 1, f->blocks[0].session = 0, f->blocks[0].refcount = 1;
    for (int i = 0; i < 2; i++) {
        f->steps[i].step = step - 1 + (uint64_t)i;
        f->steps[i].t_ms = 10.0 * (double)(step - 1 + (uint64_t)i);
        f->steps[i].dur_ms = 2.5;
        f->steps[i].forward_ms = 2.0;
        f->steps[i].n_decode_tokens = 1;
        f->dec[i].step = step - 1 + (uint64_t)i;
        f->dec[i].kind = KV_DEC_ADMIT;
        f->dec[i].req = 1;
        snprintf(f->dec[i].text, sizeof f->dec[i].text, "admit #1 at step %llu",
                 (unsigned long long)(step - 1 + (uint64_t)i));
    }
    s->n_requests = 2, s->requests = f->req;
    s->n_table_entries = 3, s->tables = f->tables;
    s->n_running = 1, s->running = f->running;
    s->n_waiting = 1, s->waiting = f->waiting;
    s->blocks = f->blocks;
    s->n_steps = 2, s->steps = f->steps;
    s->n_decisions = 2, s->decisions = f->dec;
}

static char dir[] = "/tmp/kvtop-trace-XXXXXX";

static void test_roundtrip(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/a.kvtrace", dir);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, "model:\n  path: x.gguf\n", &err);
    REQUIRE(w);
    fake a, b;
    make(&a, 5);
    CHECK(kv_trace_writer_add(w, &a.s) == 1);
    CHECK(kv_trace_writer_add(w, &a.s) == 0); /* same step: skipped */
    make(&b, 6);
    CHECK(kv_trace_writer_add(w, &b.s) == 1);
    CHECK(kv_trace_writer_frames(w) == 2);
    CHECK(kv_trace_writer_close(w) == 0);

    kv_trace *t = kv_trace_load(path, &err);
    REQUIRE(t);
    CHECK(kv_trace_n_frames(t) == 2);
    CHECK(!strcmp(kv_trace_profile(t), "model:\n  path: x.gguf\n"));
    const kv_snapshot *s = kv_trace_frame(t, 1);
    REQUIRE(s);
    CHECK(s->step == 6 && s->now_ms == 60.0 && !strcmp(s->model_name, "stories260K"));
    CHECK(s->n_requests == 2 && s->requests[1].id == 2 && !strcmp(s->requests[1].wait_reason, "3 free blocks, needs 9"));
    CHECK(s->n_table_entries == 3 && s->tables[2] == 4);
    CHECK(s->n_running == 1 && s->running[0] == 1 && s->n_waiting == 1 && s->waiting[0] == 2 && s->n_swapped == 0);
    CHECK(s->n_blocks == 6 && s->blocks[0].state == 1 && s->blocks[0].session == 0 && s->blocks[5].session == -1);
    CHECK(s->n_steps == 2 && s->steps[1].step == 6 && s->n_decisions == 2);
    CHECK(kv_trace_frame(t, 2) == NULL && kv_trace_frame(t, -1) == NULL);

    /* Chrome export: steps 4, 5, 6 and decisions 4, 5, 6 once each. */
    char json[512];
    snprintf(json, sizeof json, "%s/a.json", dir);
    CHECK(kv_trace_export_chrome(t, json, &err) == 0);
    FILE *f = fopen(json, "rb");
    REQUIRE(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    kv_json *doc = kv_json_parse(buf, n, &err);
    REQUIRE(doc);
    const kv_json *ev = kv_json_get(doc, "traceEvents");
    int steps = 0, decisions = 0, requests = 0, counters = 0, forward = 0;
    for (size_t i = 0; i < kv_json_len(ev); i++) {
        const kv_json *e = kv_json_at(ev, i);
        const char *cat = kv_json_str(kv_json_get(e, "cat"), NULL);
        const char *ph = kv_json_str(kv_json_get(e, "ph"), NULL);
        if (!cat) continue;
        if (!strcmp(cat, "step")) {
            steps++;
            CHECK(!strcmp(ph, "X") && kv_json_number(kv_json_get(e, "dur")) == 2500.0);
        }
        forward += !strcmp(cat, "forward");
        decisions += !strcmp(cat, "decision");
        counters += !strcmp(cat, "counter");
        if (!strcmp(cat, "request") && !strcmp(kv_json_str(kv_json_get(e, "name"), NULL), "request #1")) {
            requests++;
            /* From the last frame: 6 generated. */
            CHECK(kv_json_number(kv_json_get(kv_json_get(e, "args"), "generated")) == 6);
        }
    }
    CHECKF(steps == 3 && decisions == 3 && forward == 3, "%d steps %d decisions", steps, decisions);
    CHECK(requests == 1 && counters == 4);
    kv_json_free(doc);
    kv_trace_free(t);
    unlink(json);
    unlink(path);
}

static void test_bad_files(void) {
    kv_err err;
    char path[512];
    snprintf(path, sizeof path, "%s/b.kvtrace", dir);
    CHECK(kv_trace_load("/nonexistent/x.kvtrace", &err) == NULL && err.code == KV_ERR_IO);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs("not a trace at all", f);
    fclose(f);
    CHECK(kv_trace_load(path, &err) == NULL && strstr(err.msg, "not a kvtop trace"));
    /* A good file cut at every length: rejected cleanly, or (at a frame
     * boundary) loaded with fewer frames. */
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    fake a, b;
    make(&a, 1);
    make(&b, 2);
    kv_trace_writer_add(w, &a.s);
    kv_trace_writer_add(w, &b.s);
    kv_trace_writer_close(w);
    f = fopen(path, "rb");
    static char full[1 << 16];
    size_t n = fread(full, 1, sizeof full, f);
    fclose(f);
    int loaded = 0;
    for (size_t cut = 0; cut < n; cut += 7) {
        f = fopen(path, "wb");
        fwrite(full, 1, cut, f);
        fclose(f);
        kv_trace *t = kv_trace_load(path, &err);
        if (t) {
            CHECK(kv_trace_n_frames(t) <= 1);
            loaded++;
            kv_trace_free(t);
        }
    }
    CHECK(loaded <= 2);
    /* A huge count in a frame is refused, not allocated. */
    f = fopen(path, "wb");
    fwrite(full, 1, n, f);
    fclose(f);
    w = kv_trace_writer_open(path, NULL, &err);
    kv_trace_writer_close(w);
    f = fopen(path, "ab");
    uint32_t magic = 0x4d415246u, counts[8] = {0xffffffffu, 0, 0, 0, 0, 0, 0, 0};
    fwrite(&magic, 4, 1, f);
    fwrite(&a.s, sizeof a.s, 1, f);
    fwrite(counts, sizeof counts, 1, f);
    fclose(f);
    CHECK(kv_trace_load(path, &err) == NULL && strstr(err.msg, "entries"));
    CHECK(kv_trace_writer_open("/nonexistent/dir/t", NULL, &err) == NULL && strstr(err.msg, "/nonexistent/dir/t"));
    unlink(path);
}

static void setup(void) { REQUIRE(mkdtemp(dir)); }
static void teardown(void) { rmdir(dir); }

TEST_MAIN(T(setup), T(test_roundtrip), T(test_bad_files), T(teardown))
