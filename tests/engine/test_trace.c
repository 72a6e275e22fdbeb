/* test_trace.c - trace files (format 2): frames written and read back field
 * for field, an unchanged step not written twice, a long run of random
 * changes (requests coming and going, blocks, queues, step records and
 * decisions, an engine restart) rebuilt exactly in any order, a
 * recording from a real engine cut at every byte loading exactly its
 * complete frames, corrupt and version 1 files rejected, and the Chrome
 * trace-event export parsed back as JSON with each step, decision and
 * request exactly once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../engine_helpers.h"
#include "../../engine/json.h"
#include "../../engine/trace.h"

/* The format's constants, as trace.h describes them. */
#define FRAME_MAGIC 0x4d415246u
#define HEAD_WORDS ((sizeof(kv_snapshot) + 7) / 8)

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

/* The whole file at path into a malloc'd buffer (NUL-terminated). */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[len] = 0;
    *n = (size_t)len;
    return buf;
}

static void spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Counts of the Chrome export's events by category. */
typedef struct chrome_counts {
    int steps, decisions, requests, counters, forward;
    int dup_steps;  /* step events whose name came before */
} chrome_counts;

static int chrome_count(const char *path, chrome_counts *c) {
    memset(c, 0, sizeof *c);
    size_t n;
    char *buf = slurp(path, &n);
    if (!buf) return -1;
    kv_err err;
    kv_json *doc = kv_json_parse(buf, n, &err);
    free(buf);
    if (!doc) return -1;
    const kv_json *ev = kv_json_get(doc, "traceEvents");
    size_t n_ev = kv_json_len(ev);
    uint64_t *seen = calloc(n_ev + 1, sizeof *seen);
    int n_seen = 0;
    for (size_t i = 0; i < n_ev; i++) {
        const kv_json *e = kv_json_at(ev, i);
        const char *cat = kv_json_str(kv_json_get(e, "cat"), NULL);
        const char *name = kv_json_str(kv_json_get(e, "name"), NULL);
        if (!cat || !name) continue;
        if (!strcmp(cat, "step")) {
            c->steps++;
            uint64_t no = strtoull(name + 5, NULL, 10);
            for (int k = 0; k < n_seen; k++) c->dup_steps += seen[k] == no;
            if (seen) seen[n_seen++] = no;
        }
        c->forward += !strcmp(cat, "forward");
        c->decisions += !strcmp(cat, "decision");
        c->counters += !strcmp(cat, "counter");
        c->requests += !strcmp(cat, "request") && !strncmp(name, "request #", 9);
    }
    free(seen);
    kv_json_free(doc);
    return 0;
}

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
    /* the windows: the last two records up to step 6, stored once */
    CHECK(s->n_steps == 2 && s->steps[0].step == 5 && s->steps[1].step == 6);
    CHECK(s->n_decisions == 2 && s->decisions[0].step == 5 && s->decisions[1].step == 6);
    CHECK(kv_trace_frame(t, 2) == NULL && kv_trace_frame(t, -1) == NULL && kv_trace_frame(NULL, 0) == NULL);
    s = kv_trace_frame(t, 0);
    REQUIRE(s);
    CHECK(s->step == 5 && s->n_steps == 2 && s->steps[1].step == 5 && s->requests[0].n_generated == 5);

    /* Chrome export: steps 4, 5, 6 and decisions 4, 5, 6 once each. */
    char json[512];
    snprintf(json, sizeof json, "%s/a.json", dir);
    CHECK(kv_trace_export_chrome(t, json, &err) == 0);
    CHECK(s->step == 5 && s->requests[0].n_generated == 5); /* the frame shown stays */
    chrome_counts c;
    REQUIRE(chrome_count(json, &c) == 0);
    CHECKF(c.steps == 3 && c.decisions == 3 && c.forward == 3, "%d steps %d decisions", c.steps, c.decisions);
    CHECK(c.requests == 2 && c.counters == 4 && c.dup_steps == 0);
    /* request #1 as in the last frame: 6 generated */
    size_t n;
    char *buf = slurp(json, &n);
    REQUIRE(buf);
    kv_json *doc = kv_json_parse(buf, n, &err);
    free(buf);
    REQUIRE(doc);
    const kv_json *ev = kv_json_get(doc, "traceEvents");
    int found = 0;
    for (size_t i = 0; i < kv_json_len(ev); i++) {
        const kv_json *e = kv_json_at(ev, i);
        const char *name = kv_json_str(kv_json_get(e, "name"), NULL);
        if (name && !strcmp(name, "request #1")) {
            found++;
            CHECK(kv_json_number(kv_json_get(kv_json_get(e, "args"), "generated")) == 6);
        }
    }
    CHECK(found == 1);
    kv_json_free(doc);
    kv_trace_free(t);
    unlink(json);
    unlink(path);
}

/* ---- a long run of random changes ---- */

enum { SIM_REQ = 40, SIM_TAB = 600, SIM_BLOCKS = 300, STEP_RING = 256, DEC_RING = 1024, HIST = 8192 };

/* An engine that changes at random between frames. */
typedef struct sim {
    uint64_t rng;
    uint64_t step;
    double now;
    kv_snap_request req[SIM_REQ];
    int n_req;
    int64_t next_id;
    int32_t tables[SIM_TAB];
    int64_t run[SIM_REQ], wait[SIM_REQ], swp[SIM_REQ];
    kv_snap_block blocks[SIM_BLOCKS];
    int n_blocks;
    kv_step_record steps[HIST]; /* since the last restart */
    int n_steps;
    kv_decision dec[HIST];
    int n_dec;
    int exported_steps, exported_dec; /* records a correct writer stores, all restarts together */
    int reset_frame, jump_frame;      /* the frames written right after the restart and the jump */
    kv_snapshot s;
} sim;

static uint32_t rnd(sim *m) {
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return (uint32_t)(m->rng >> 16);
}

static void sim_decide(sim *m, uint64_t step) {
    if (m->n_dec >= HIST) return;
    kv_decision *d = &m->dec[m->n_dec++];
    memset(d, 0, sizeof *d);
    d->step = step;
    d->kind = (kv_decision_kind)(rnd(m) % KV_DEC_KIND_COUNT);
    d->req = m->n_req ? m->req[rnd(m) % (uint32_t)m->n_req].id : 0;
    snprintf(d->text, sizeof d->text, "decision %d at step %llu", m->n_dec, (unsigned long long)step);
    m->exported_dec++;
}

/* Requests added or finished, rows and blocks changed, then `advance`
 * steps with their records and decisions (the ring keeps the last 256 of
 * them, like the engine's). */
static void sim_tick(sim *m, int advance) {
    /* decisions between steps (a rejection): of the step already recorded */
    if (m->step > 0 && rnd(m) % 5 == 0) sim_decide(m, m->step);
    if (m->n_req < SIM_REQ && rnd(m) % 4 == 0) {
        kv_snap_request *q = &m->req[m->n_req++];
        memset(q, 0, sizeof *q);
        q->id = ++m->next_id;
        q->session = (int)(rnd(m) % 5);
        q->state = KV_REQ_WAITING;
        q->n_prompt = 1 + (int)(rnd(m) % 100);
        q->max_tokens = 64;
        q->arrival_ms = m->now;
        q->ttft_ms = q->e2e_ms = -1;
        snprintf(q->wait_reason, sizeof q->wait_reason, "%u free blocks, needs %u", rnd(m) % 9, rnd(m) % 20);
    }
    if (m->n_req > 0 && rnd(m) % 6 == 0) {
        int k = (int)(rnd(m) % (uint32_t)m->n_req);
        memmove(&m->req[k], &m->req[k + 1], (size_t)(m->n_req - k - 1) * sizeof m->req[0]);
        m->n_req--;
    }
    for (int i = 0; i < m->n_req; i++) {
        kv_snap_request *q = &m->req[i];
        if (rnd(m) % 3) continue;
        q->state = (kv_req_state)(rnd(m) % 4);
        q->n_computed += (int)(rnd(m) % 17);
        q->n_generated++;
        q->n_blocks = (int)(rnd(m) % 12);
        q->tpot_ms = (double)(rnd(m) % 1000) / 7.0;
        q->next_block = (int)(rnd(m) % SIM_BLOCKS);
    }
    int changes = (int)(rnd(m) % 8);
    for (int i = 0; i < changes && m->n_blocks; i++) {
        kv_snap_block *b = &m->blocks[rnd(m) % (uint32_t)m->n_blocks];
        b->state = (uint8_t)(rnd(m) % 3);
        b->fill = (uint16_t)(rnd(m) % 17);
        b->refcount = (uint16_t)(rnd(m) % 3);
        b->owner = b->state ? (int32_t)(rnd(m) % 50) : -1;
        b->session = b->state ? (int32_t)(rnd(m) % 5) : -1;
    }
    for (int k = 0; k < advance; k++) {
        m->step++;
        m->now += 1.0 + (double)(rnd(m) % 100) / 10.0;
        if (m->n_steps < HIST) {
            kv_step_record *r = &m->steps[m->n_steps++];
            memset(r, 0, sizeof *r);
            r->step = m->step;
            r->t_ms = m->now;
            r->dur_ms = 0.5 + (double)(rnd(m) % 50) / 10.0;
            r->forward_ms = r->dur_ms / 2;
            r->n_seqs = m->n_req;
            r->n_decode_tokens = (int)(rnd(m) % 9);
            /* a jump over more than the ring: the oldest are never seen */
            if (advance - k <= STEP_RING) m->exported_steps++;
        }
        int nd = (int)(rnd(m) % 4);
        for (int d = 0; d < nd; d++) sim_decide(m, m->step);
    }
}

/* The snapshot of the simulated engine now. */
static const kv_snapshot *sim_snapshot(sim *m) {
    kv_snapshot *s = &m->s;
    memset(s, 0, sizeof *s);
    s->step = m->step;
    s->now_ms = m->now;
    snprintf(s->model_name, sizeof s->model_name, "sim model");
    snprintf(s->backend, sizeof s->backend, "cpu");
    s->block_size = 16;
    s->metrics.elapsed_s = m->now / 1000.0;
    s->metrics.output_tokens = m->step * 3;
    s->metrics.ttft_ms.p50 = (double)(rnd(m) % 100);
    int nt = 0, nr = 0, nw = 0, ns = 0;
    for (int i = 0; i < m->n_req; i++) {
        kv_snap_request *q = &m->req[i];
        int nb = KV_MIN(q->n_blocks, SIM_TAB - nt);
        q->table_offset = nt;
        q->n_blocks = nb;
        for (int b = 0; b < nb; b++) m->tables[nt + b] = (int32_t)((q->id * 7 + b) % SIM_BLOCKS);
        nt += nb;
        if (q->state == KV_REQ_RUNNING) m->run[nr++] = q->id;
        else if (q->state == KV_REQ_SWAPPED) m->swp[ns++] = q->id;
        else m->wait[nw++] = q->id;
    }
    s->n_requests = m->n_req, s->requests = m->req;
    s->n_table_entries = nt, s->tables = m->tables;
    s->n_running = nr, s->running = m->run;
    s->n_waiting = nw, s->waiting = m->wait;
    s->n_swapped = ns, s->swapped = m->swp;
    s->n_blocks = m->n_blocks, s->blocks = m->blocks;
    int n_st = KV_MIN(m->n_steps, STEP_RING), n_dc = KV_MIN(m->n_dec, DEC_RING);
    s->n_steps = n_st, s->steps = m->steps + m->n_steps - n_st;
    s->n_decisions = n_dc, s->decisions = m->dec + m->n_dec - n_dc;
    s->blocks_used = nt;
    return s;
}

/* A new engine: steps from 0, another block pool, no history. */
static void sim_restart(sim *m, int n_blocks) {
    m->step = 0;
    m->n_steps = m->n_dec = 0;
    m->n_blocks = n_blocks;
    for (int i = 0; i < n_blocks; i++) {
        memset(&m->blocks[i], 0, sizeof m->blocks[i]);
        m->blocks[i].owner = m->blocks[i].session = -1;
    }
}

/* A deep copy (freed with kv_snapshot_free). */
static kv_snapshot *snap_dup(const kv_snapshot *s) {
    kv_snapshot *d = kv_snapshot_new();
    if (!d) return NULL;
    memcpy(d, s, sizeof *d); /* padding too: frames are compared byte for byte */
#define DUP(f, n)                                                            \
    d->f = NULL;                                                             \
    if ((n) > 0) {                                                           \
        d->f = malloc((size_t)(n) * sizeof *s->f);                           \
        if (d->f) memcpy(d->f, s->f, (size_t)(n) * sizeof *s->f);            \
    }
    DUP(requests, s->n_requests)
    DUP(tables, s->n_table_entries)
    DUP(running, s->n_running)
    DUP(waiting, s->n_waiting)
    DUP(swapped, s->n_swapped)
    DUP(blocks, s->n_blocks)
    DUP(steps, s->n_steps)
    DUP(decisions, s->n_decisions)
#undef DUP
    return d;
}

/* Field for field: the struct (pointers and capacities aside) and every
 * array, the step and decision windows included. */
static int snap_equal(const kv_snapshot *got, const kv_snapshot *want, int frame) {
    kv_snapshot a, b;
    memcpy(&a, got, sizeof a);
    memcpy(&b, want, sizeof b);
    kv_snapshot *both[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        kv_snapshot *x = both[i];
        x->requests = NULL, x->tables = NULL, x->running = NULL, x->waiting = NULL;
        x->swapped = NULL, x->blocks = NULL, x->steps = NULL, x->decisions = NULL;
        x->cap_requests = x->cap_tables = x->cap_queue = x->cap_blocks = x->cap_steps = x->cap_decisions = 0;
    }
    if (memcmp(&a, &b, sizeof a)) {
        fprintf(stderr, "  frame %d: struct differs (step %llu vs %llu, %d vs %d steps)\n", frame,
                (unsigned long long)a.step, (unsigned long long)b.step, a.n_steps, b.n_steps);
        return 0;
    }
#define SAME(f, n)                                                                            \
    if ((n) > 0 && (!got->f || !want->f || memcmp(got->f, want->f, (size_t)(n) * sizeof *got->f))) { \
        fprintf(stderr, "  frame %d: %s differ\n", frame, #f);                                \
        return 0;                                                                             \
    }
    SAME(requests, a.n_requests)
    SAME(tables, a.n_table_entries)
    SAME(running, a.n_running)
    SAME(waiting, a.n_waiting)
    SAME(swapped, a.n_swapped)
    SAME(blocks, a.n_blocks)
    SAME(steps, a.n_steps)
    SAME(decisions, a.n_decisions)
#undef SAME
    return 1;
}

enum { RUN_FRAMES = 200, RESET_AT = 120 };

/* Writes the random run to path; want[] gets a copy of every frame
 * written. Returns the frames written. */
static int write_run(const char *path, kv_snapshot **want, int max_frames, sim *m) {
    memset(m, 0, sizeof *m);
    m->rng = 0x9e3779b97f4a7c15ull;
    sim_restart(m, 200);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, "random: run\n", &err);
    if (!w) return -1;
    int n = 0;
    for (int f = 0; n < max_frames && f < max_frames * 2; f++) {
        if (f == RESET_AT) sim_restart(m, 150); /* fewer blocks: the map shrinks */
        int adv = f == 40 ? 300 : f % 17 == 5 ? 0 : 1 + (f % 23 == 0); /* a jump, a repeat, a double step */
        sim_tick(m, adv);
        const kv_snapshot *s = sim_snapshot(m);
        if (f == RESET_AT) m->reset_frame = n;
        if (f == 40) m->jump_frame = n;
        int rc = kv_trace_writer_add(w, s);
        if (rc == 1) want[n++] = snap_dup(s);
        else if (rc != 0 || adv != 0) n = -1000; /* only an unchanged step is skipped */
    }
    if (kv_trace_writer_frames(w) != n) n = -1;
    if (kv_trace_writer_close(w)) n = -1;
    return n;
}

static void test_random_run(void) {
    char path[512], json[512];
    snprintf(path, sizeof path, "%s/r.kvtrace", dir);
    snprintf(json, sizeof json, "%s/r.json", dir);
    static kv_snapshot *want[RUN_FRAMES];
    static sim m;
    int n = write_run(path, want, RUN_FRAMES, &m);
    REQUIRE(n == RUN_FRAMES);
    kv_err err;
    kv_trace *t = kv_trace_load(path, &err);
    if (!t) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(t);
    CHECK(kv_trace_n_frames(t) == n);
    int bad = 0;
    /* forward, backward, then at random */
    for (int i = 0; i < n && bad < 3; i++) bad += !snap_equal(kv_trace_frame(t, i), want[i], i);
    for (int i = n - 1; i >= 0 && bad < 3; i--) bad += !snap_equal(kv_trace_frame(t, i), want[i], i);
    uint64_t r = 12345;
    for (int k = 0; k < 600 && bad < 3; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((r >> 33) % (uint64_t)n);
        bad += !snap_equal(kv_trace_frame(t, i), want[i], i);
    }
    CHECKF(bad == 0, "%d frames differ", bad);
    /* after the restart the history starts over */
    const kv_snapshot *s = kv_trace_frame(t, m.reset_frame);
    REQUIRE(s);
    CHECK(s->step == 1 && s->n_steps == 1 && s->steps[0].step == 1 && s->n_blocks == 150);
    s = kv_trace_frame(t, m.reset_frame - 1);
    REQUIRE(s);
    CHECK(s->step > 300 && s->n_blocks == 200);
    /* the jump keeps the ring's 256 */
    s = kv_trace_frame(t, m.jump_frame);
    REQUIRE(s);
    CHECK(s->n_steps == STEP_RING && s->steps[STEP_RING - 1].step == s->step);

    /* export: every step and decision once; the frame shown stays */
    s = kv_trace_frame(t, 77);
    CHECK(kv_trace_export_chrome(t, json, &err) == 0);
    CHECK(snap_equal(s, want[77], 77));
    chrome_counts c;
    REQUIRE(chrome_count(json, &c) == 0);
    CHECKF(c.steps == m.exported_steps && c.decisions == m.exported_dec, "%d/%d steps, %d/%d decisions", c.steps,
           m.exported_steps, c.decisions, m.exported_dec);
    CHECK(c.counters == 2 * n && c.requests > 10);
    CHECKF(c.dup_steps > 0, "steps 1.. recorded twice around the restart: %d", c.dup_steps);
    kv_trace_free(t);

    /* Cut anywhere past the header: the frames before the cut, exactly
     * (a cut recording); inside the header: rejected naming the file. */
    size_t size;
    char *full = slurp(path, &size);
    REQUIRE(full);
    char cut_path[512];
    snprintf(cut_path, sizeof cut_path, "%s/cut.kvtrace", dir);
    int loaded = 0, rejected = 0, prev_cn = 0;
    for (size_t cut = 0; cut < size; cut += cut < 8192 ? 37 : 997) {
        spit(cut_path, full, cut);
        kv_trace *ct = kv_trace_load(cut_path, &err);
        if (!ct) {
            rejected++;
            CHECK(err.code == KV_ERR_FORMAT && strstr(err.msg, cut_path) && cut < 64);
            continue;
        }
        loaded++;
        int cn = kv_trace_n_frames(ct);
        /* a cut that lands exactly on a frame boundary (the layout moves
         * with the snapshot's size) is a complete shorter recording */
        int boundary = !kv_trace_truncated(ct) && !kv_trace_end_note(ct)[0];
        CHECKF(cn < n && cn >= prev_cn && (boundary || strstr(kv_trace_end_note(ct), "cut off")),
               "cut at %zu: %d of %d frames, truncated %d, note '%s'", cut, cn, n, kv_trace_truncated(ct),
               kv_trace_end_note(ct));
        prev_cn = cn;
        for (int i = 0; i < cn; i++) CHECK(snap_equal(kv_trace_frame(ct, i), want[i], i));
        kv_trace_free(ct);
    }
    CHECK(rejected == 2 && loaded > 100 && prev_cn > n / 2); /* cuts 0 and 37 lie in the 52-byte header */
    /* the frame boundaries: a file with the first k frames loads them all,
     * one byte less loads k-1 and says it was cut after frame k-2 */
    for (int k = 1; k <= 3; k++) {
        static sim m2;
        static kv_snapshot *w2[RUN_FRAMES];
        if (write_run(cut_path, w2, k, &m2) != k) CHECK(0);
        for (int i = 0; i < k; i++) kv_snapshot_free(w2[i]);
        size_t bn;
        char *part = slurp(cut_path, &bn);
        REQUIRE(part);
        CHECK(bn < size && !memcmp(part, full, bn));
        free(part);
        kv_trace *ct = kv_trace_load(cut_path, &err);
        CHECK(ct && kv_trace_n_frames(ct) == k && !kv_trace_truncated(ct) && !kv_trace_end_note(ct)[0]);
        kv_trace_free(ct);
        spit(cut_path, full, bn - 1);
        char frame_no[64];
        if (k > 1) snprintf(frame_no, sizeof frame_no, "ends mid-frame after frame %d (%d complete", k - 2, k - 1);
        else snprintf(frame_no, sizeof frame_no, "ends inside its first frame");
        ct = kv_trace_load(cut_path, &err);
        CHECKF(ct && kv_trace_n_frames(ct) == k - 1 && kv_trace_truncated(ct) &&
                   strstr(kv_trace_end_note(ct), frame_no) && strstr(kv_trace_end_note(ct), cut_path),
               "k %d: %s", k, ct ? kv_trace_end_note(ct) : err.msg);
        kv_trace_free(ct);
    }
    free(full);
    for (int i = 0; i < n; i++) kv_snapshot_free(want[i]);
    unlink(cut_path);
    unlink(json);
    unlink(path);
}

/* ---- corrupt files ---- */

/* Loads bytes from memory; NULL with err filled when rejected. */
static kv_trace *load_mem(const void *data, size_t n, kv_err *err) {
    FILE *f = fmemopen((void *)data, n, "rb");
    if (!f) return NULL;
    kv_trace *t = kv_trace_load_stream(f, "mem.kvtrace", err);
    fclose(f);
    return t;
}

/* A file built by hand, to write what the writer never would. */
typedef struct hand {
    char *buf;
    size_t len;
    FILE *f;
} hand;

static void put32(hand *h, uint32_t x) { fwrite(&x, 4, 1, h->f); }

static void hand_open(hand *h, uint32_t version) {
    h->f = open_memstream(&h->buf, &h->len);
    fwrite("KVTRACE1", 1, 8, h->f);
    put32(h, version);
    uint32_t sizes[6] = {(uint32_t)sizeof(kv_snapshot), (uint32_t)sizeof(kv_snap_request),
                         (uint32_t)sizeof(kv_snap_block), (uint32_t)sizeof(kv_step_record),
                         (uint32_t)sizeof(kv_decision), (uint32_t)sizeof(int64_t)};
    fwrite(sizes, sizeof sizes, 1, h->f);
    put32(h, 0); /* no profile */
}

/* A frame with no records: the struct (full, or a delta of no words), and
 * six arrays, empty and full except requests, which get `req_count` with
 * mode req_mode and no elements. */
static void hand_frame(hand *h, uint32_t flags, int head_full, uint32_t req_count, uint32_t req_mode) {
    put32(h, FRAME_MAGIC);
    put32(h, flags);
    put32(h, 0);
    put32(h, 0);
    put32(h, (uint32_t)HEAD_WORDS);
    put32(h, head_full ? 0 : 1);
    if (head_full) {
        uint64_t zero[HEAD_WORDS];
        memset(zero, 0, sizeof zero);
        fwrite(zero, sizeof zero, 1, h->f);
    } else {
        put32(h, 0);
    }
    put32(h, req_count);
    put32(h, req_mode);
    if (req_mode == 1) put32(h, 0);
    for (int a = 0; a < 5; a++) put32(h, 0), put32(h, 0);
}

static void hand_close(hand *h) { fclose(h->f); }

static void test_bad_files(void) {
    kv_err err;
    char path[512];
    snprintf(path, sizeof path, "%s/b.kvtrace", dir);
    CHECK(kv_trace_load("/nonexistent/x.kvtrace", &err) == NULL && err.code == KV_ERR_IO);
    spit(path, "not a trace at all", 18);
    CHECK(kv_trace_load(path, &err) == NULL && strstr(err.msg, "not a kvtop trace"));
    CHECK(kv_trace_writer_open("/nonexistent/dir/t", NULL, &err) == NULL && strstr(err.msg, "/nonexistent/dir/t"));

    /* the hand-built file loads when it follows the rules; keyframes may
     * be far apart */
    hand h;
    hand_open(&h, 2);
    hand_frame(&h, 0, 1, 0, 0);
    for (int i = 0; i < 300; i++) hand_frame(&h, 0, 0, 0, 0);
    hand_close(&h);
    kv_trace *t = load_mem(h.buf, h.len, &err);
    CHECK(t && kv_trace_n_frames(t) == 301 && kv_trace_frame(t, 150) && kv_trace_frame(t, 300));
    CHECK(t && kv_trace_frame(t, 300)->n_requests == 0 && kv_trace_frame(t, 0)->step == 0);
    kv_trace_free(t);
    free(h.buf);

    /* hand-built files the loader refuses, each with its reason */
    static const struct {
        uint32_t version;
        int n_frames;
        struct {
            uint32_t flags;
            int head_full;
            uint32_t req_count, req_mode;
        } f[2];
        const char *msg;
    } cases[] = {
        {1, 0, {{0}}, "version 1"},
        {3, 0, {{0}}, "version 3"},
        {2, 1, {{0, 0, 0, 0}}, "frame 0: not a keyframe"},
        {2, 1, {{0, 1, 0xffffffffu, 0}}, "entries"},
        {2, 2, {{0, 1, 0, 0}, {6, 0, 0, 0}}, "frame 1: unknown flags"},
        {2, 2, {{0, 1, 0, 0}, {0, 0, 0, 2}}, "frame 1: array requests: bad mode"},
        {2, 2, {{0, 1, 0, 0}, {0, 0, 1000000, 1}}, "frame 1: array requests grows"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hand_open(&h, cases[c].version);
        for (int i = 0; i < cases[c].n_frames; i++)
            hand_frame(&h, cases[c].f[i].flags, cases[c].f[i].head_full, cases[c].f[i].req_count,
                       cases[c].f[i].req_mode);
        hand_close(&h);
        t = load_mem(h.buf, h.len, &err);
        CHECKF(t == NULL && strstr(err.msg, cases[c].msg) && strstr(err.msg, "mem.kvtrace"), "case %zu: %s", c,
               t ? "loaded" : err.msg);
        kv_trace_free(t);
        free(h.buf);
    }
    /* A writer's delta patched: the last frame's block map changes in one
     * block, so the file ends in count, mode 1, n = 1, index, element. */
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    fake a, b;
    make(&a, 1);
    make(&b, 2);
    b.blocks[3].state = 2;
    kv_trace_writer_add(w, &a.s);
    kv_trace_writer_add(w, &b.s);
    CHECK(kv_trace_writer_close(w) == 0);
    size_t n;
    char *good = slurp(path, &n);
    REQUIRE(good && n > 40);
    const size_t el = sizeof(kv_snap_block), tail = 4 * 4 + el;
    uint32_t v[4];
    memcpy(v, good + n - tail, sizeof v);
    CHECK(v[0] == 6 && v[1] == 1 && v[2] == 1 && v[3] == 3);
    t = load_mem(good, n, &err);
    CHECK(t && kv_trace_frame(t, 1) && kv_trace_frame(t, 1)->blocks[3].state == 2 &&
          kv_trace_frame(t, 0)->blocks[3].state == 0);
    kv_trace_free(t);
    struct {
        int word;
        uint32_t value;
        const char *msg;
    } patch[] = {
        {3, 6, "frame 1: array blocks: index 6 out of range (6 entries)"},
        {3, 0xfffffff0u, "index 4294967280 out of range"},
        {1, 9, "frame 1: array blocks: bad mode 9"},
        {2, 0x7fffffffu, "entries"},
        {0, 8, "frame 1: array blocks grows to 8 entries with 1 written"},
        {0, 0x02000000u, "frame 1: array blocks has 33554432 entries"},
    };
    char *bad = malloc(n);
    REQUIRE(bad);
    for (size_t i = 0; i < sizeof patch / sizeof patch[0]; i++) {
        memcpy(bad, good, n);
        memcpy(bad + n - tail + 4 * (size_t)patch[i].word, &patch[i].value, 4);
        t = load_mem(bad, n, &err);
        CHECKF(t == NULL && strstr(err.msg, patch[i].msg), "patch %zu: %s", i, t ? "loaded" : err.msg);
        kv_trace_free(t);
    }
    /* a delta promising more entries than the file holds reads as a cut
     * recording: the frame before it loads, and the trace says so */
    memcpy(bad, good, n);
    uint32_t two = 2;
    memcpy(bad + n - tail + 8, &two, 4);
    t = load_mem(bad, n, &err);
    CHECKF(t && kv_trace_n_frames(t) == 1 && kv_trace_truncated(t) &&
               strstr(kv_trace_end_note(t), "mem.kvtrace: trace ends mid-frame after frame 0"),
           "%s", t ? kv_trace_end_note(t) : err.msg);
    kv_trace_free(t);
    /* a shrunk array is fine */
    memcpy(bad, good, n);
    uint32_t five = 5;
    memcpy(bad + n - tail, &five, 4);
    t = load_mem(bad, n, &err);
    CHECK(t && kv_trace_frame(t, 1)->n_blocks == 5 && kv_trace_frame(t, 1)->blocks[3].state == 2);
    kv_trace_free(t);
    /* a request whose block table lies outside the tables is clamped */
    free(bad);
    free(good);
    a.req[0].table_offset = 2, a.req[0].n_blocks = 5;
    b.req[1].n_blocks = -3;
    w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    memset(a.s.model_name, 'x', sizeof a.s.model_name);
    memset(a.req[1].wait_reason, 'y', sizeof a.req[1].wait_reason);
    kv_trace_writer_add(w, &a.s);
    kv_trace_writer_add(w, &b.s);
    kv_trace_writer_close(w);
    t = kv_trace_load(path, &err);
    REQUIRE(t);
    const kv_snapshot *s = kv_trace_frame(t, 0);
    CHECK(s->requests[0].n_blocks == 0 && s->requests[0].table_offset == 0);
    CHECK(strlen(s->model_name) == sizeof s->model_name - 1 && strlen(s->requests[1].wait_reason) < 96);
    s = kv_trace_frame(t, 1);
    CHECK(s->requests[0].n_blocks == 3 && s->requests[1].n_blocks == 0);
    s = kv_trace_frame(t, 0); /* clamping did not leak into the rebuilt arrays */
    CHECK(s->requests[0].n_blocks == 0 && s->requests[1].wait_reason[95] == 0);
    kv_trace_free(t);
    unlink(path);
}

/* Decisions of a step already written (rejections between steps) are
 * written once more each, never again; a step lower than the last frame's
 * (a new engine) starts the history over. */
static void test_decision_counts(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/d.kvtrace", dir);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    fake f;
    make(&f, 3); /* steps 2, 3; decisions 2, 3 */
    kv_decision dec[5];
    memcpy(dec, f.dec, sizeof f.dec);
    CHECK(kv_trace_writer_add(w, &f.s) == 1);
    /* step 4 after two rejections recorded at step 3 */
    dec[2] = dec[1], dec[3] = dec[1];
    snprintf(dec[2].text, sizeof dec[2].text, "reject A");
    snprintf(dec[3].text, sizeof dec[3].text, "reject B");
    dec[4] = dec[1];
    dec[4].step = 4;
    kv_step_record st[3] = {f.steps[0], f.steps[1], f.steps[1]};
    st[2].step = 4;
    f.s.step = 4;
    f.s.steps = st, f.s.n_steps = 3;
    f.s.decisions = dec, f.s.n_decisions = 5;
    CHECK(kv_trace_writer_add(w, &f.s) == 1);
    /* the ring dropped its oldest; nothing new */
    f.s.step = 5;
    f.s.decisions = dec + 2, f.s.n_decisions = 3;
    CHECK(kv_trace_writer_add(w, &f.s) == 1);
    /* a new engine at step 1 */
    fake g;
    make(&g, 1);
    CHECK(kv_trace_writer_add(w, &g.s) == 1);
    CHECK(kv_trace_writer_close(w) == 0);
    kv_trace *t = kv_trace_load(path, &err);
    REQUIRE(t);
    const kv_snapshot *s = kv_trace_frame(t, 1);
    REQUIRE(s);
    CHECK(s->n_decisions == 5 && !strcmp(s->decisions[2].text, "reject A") && s->decisions[4].step == 4);
    CHECK(s->n_steps == 3 && s->steps[2].step == 4);
    s = kv_trace_frame(t, 2);
    CHECK(s->n_decisions == 3 && !strcmp(s->decisions[0].text, "reject A") && s->decisions[2].step == 4);
    s = kv_trace_frame(t, 3);
    CHECK(s->step == 1 && s->n_steps == 2 && s->steps[0].step == 0 && s->n_decisions == 2);
    char json[512];
    snprintf(json, sizeof json, "%s/d.json", dir);
    CHECK(kv_trace_export_chrome(t, json, &err) == 0);
    chrome_counts c;
    REQUIRE(chrome_count(json, &c) == 0);
    /* steps 2, 3, 4, then 0, 1; decisions 2, 3, A, B, 4, then 0, 1 */
    CHECKF(c.steps == 5 && c.decisions == 7, "%d steps, %d decisions", c.steps, c.decisions);
    kv_trace_free(t);
    unlink(json);
    unlink(path);
}

/* An engine replaced after one step (/load): its successor's step 1 has the
 * same number as the last frame, yet kv_trace_writer_restart makes it a
 * frame of its own whose history starts over. */
static void test_restart_same_step(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/r.kvtrace", dir);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    kv_trace_writer_restart(w); /* before the first frame: nothing to restart */
    fake f, g;
    make(&f, 1);
    CHECK(kv_trace_writer_add(w, &f.s) == 1);
    make(&g, 1);
    snprintf(g.dec[1].text, sizeof g.dec[1].text, "new engine");
    CHECK(kv_trace_writer_add(w, &g.s) == 0); /* the same step without a restart: skipped */
    kv_trace_writer_restart(w);
    CHECK(kv_trace_writer_add(w, &g.s) == 1);
    CHECK(kv_trace_writer_add(w, &g.s) == 0); /* the restart is used up */
    CHECK(kv_trace_writer_frames(w) == 2);
    CHECK(kv_trace_writer_close(w) == 0);
    kv_trace *t = kv_trace_load(path, &err);
    REQUIRE(t);
    CHECK(kv_trace_n_frames(t) == 2);
    const kv_snapshot *s = kv_trace_frame(t, 1);
    REQUIRE(s);
    CHECKF(s->step == 1 && s->n_steps == 2 && s->n_decisions == 2 && !strcmp(s->decisions[1].text, "new engine"),
           "step %llu, %d steps, %d decisions", (unsigned long long)s->step, s->n_steps, s->n_decisions);
    kv_trace_free(t);
    unlink(path);
}

/* A big block map changing a block a step: keyframes come when the deltas
 * since the last one add up to its size, not every 64 frames, and every
 * frame still comes back exactly. */
static void test_big_map(void) {
    enum { NB = 20000, FRAMES = 300 };
    char path[512];
    snprintf(path, sizeof path, "%s/big.kvtrace", dir);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    kv_snap_block *blocks = calloc(NB, sizeof *blocks);
    REQUIRE(blocks);
    fake f;
    for (int i = 0; i < FRAMES; i++) {
        make(&f, (uint64_t)i + 1);
        blocks[(i * 7919) % NB].state = (uint8_t)(1 + i % 2);
        blocks[(i * 7919) % NB].fill = (uint16_t)i;
        f.s.blocks = blocks, f.s.n_blocks = NB;
        CHECK(kv_trace_writer_add(w, &f.s) == 1);
    }
    CHECK(kv_trace_writer_close(w) == 0);
    size_t size;
    char *buf = slurp(path, &size);
    REQUIRE(buf);
    free(buf);
    /* one 320 KB keyframe every 64 frames would be 1.6 MB */
    CHECKF(size < 2 * NB * sizeof *blocks + FRAMES * 1500, "%zu bytes", size);
    kv_trace *t = kv_trace_load(path, &err);
    REQUIRE(t);
    CHECK(kv_trace_n_frames(t) == FRAMES);
    for (int i = FRAMES - 1; i >= 0; i -= 7) {
        const kv_snapshot *s = kv_trace_frame(t, i);
        REQUIRE(s && s->n_blocks == NB);
        int b = (i * 7919) % NB;
        CHECK(s->blocks[b].state == 1 + i % 2 && s->blocks[b].fill == i);
        int later = (((i + 1) % FRAMES) * 7919) % NB; /* set by the next frame only (or the first) */
        if (i + 1 < FRAMES) CHECK(s->blocks[later].state == 0 || later == b);
    }
    kv_trace_free(t);
    free(blocks);
    unlink(path);
}

/* ---- a real recording, cut at every byte ---- */

enum { REC_MAX = 64 };

typedef struct recording {
    kv_snapshot *snaps[REC_MAX]; /* what the hook saw, deep copies */
    int n;
} recording;

static void rec_hook(void *user, const kv_snapshot *s) {
    recording *r = user;
    if (r->n >= REC_MAX) return;
    kv_snapshot *d = snap_dup(s);
    /* what the loader guarantees: every string ends within its field */
    for (int i = 0; d && i < d->n_decisions; i++) d->decisions[i].text[sizeof d->decisions[i].text - 1] = 0;
    for (int i = 0; d && i < d->n_requests; i++) d->requests[i].wait_reason[sizeof d->requests[i].wait_reason - 1] = 0;
    if (d) {
        d->model_name[sizeof d->model_name - 1] = 0;
        d->backend[sizeof d->backend - 1] = 0;
        d->sim_device[sizeof d->sim_device - 1] = 0;
    }
    r->snaps[r->n++] = d;
}

/* Writes the first k recorded snapshots as a trace at path (what a
 * recorder killed after frame k left, had it died between frames).
 * Returns the file's size, 0 on failure. */
static size_t write_rec(const char *path, recording *r, int k) {
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, "model:\n  path: stories260K.gguf\n", &err);
    if (!w) return 0;
    for (int i = 0; i < k; i++)
        if (kv_trace_writer_add(w, r->snaps[i]) != 1) k = -1;
    if (kv_trace_writer_close(w) || k < 0) return 0;
    size_t n;
    char *buf = slurp(path, &n);
    free(buf);
    return buf ? n : 0;
}

/* A trace recorded from a real engine (stories260K, a snapshot of every
 * step through the step hook, as the TUI's recorder takes them), cut at
 * every byte: past the header every cut loads exactly the frames that are
 * complete before it, frame for frame, says whether it ended mid-frame,
 * and exports; a cut inside the header is refused. A cut file whose
 * partial frame is corrupt in the bytes it has is still refused. */
static void test_cut_recording(void) {
    kv_config c;
    test_engine_config(&c, NULL, 1, 24, 2, 32);
    c.kv.block_size = 16;
    c.kv.prefix_sharing = 1;
    c.scheduler.prefill_chunk = 8;
    c.sampling.temperature = 0;
    kv_engine *e = test_engine_new(&c);
    REQUIRE(e);
    kv_err err;
    recording *r = calloc(1, sizeof *r);
    REQUIRE(r);
    REQUIRE(kv_engine_set_step_hook(e, rec_hook, r) == 0);
    for (int q = 0; q < 4; q++) {
        int32_t ids[24];
        for (int i = 0; i < 24; i++) ids[i] = i == 0 ? 1 : 300 + i + (q % 2) * (i > 12) * 7;
        kv_request_params p;
        kv_engine_request_defaults(e, &p);
        p.tokens = ids;
        p.n_tokens = 12 + 4 * q;
        p.max_tokens = 3 + q;
        p.ignore_eos = 1;
        p.session = q;
        CHECK(kv_engine_submit(e, &p, &err) > 0);
    }
    CHECK(kv_engine_run_until_idle(e) == 0);
    CHECK(kv_engine_set_step_hook(e, NULL, NULL) == 0);
    kv_engine_free(e);
    int n = r->n;
    REQUIRE(n >= 8 && n < REC_MAX);

    char path[512], json[512];
    snprintf(path, sizeof path, "%s/rec.kvtrace", dir);
    snprintf(json, sizeof json, "%s/rec.json", dir);
    size_t *end = calloc((size_t)n + 1, sizeof *end); /* end[k]: the file's size with k frames */
    REQUIRE(end);
    for (int k = 0; k <= n; k++) end[k] = write_rec(path, r, k);
    size_t size;
    char *full = slurp(path, &size);
    REQUIRE(full && size == end[n] && end[0] > 0);
    int bad = 0, header_refused = 0, mid = 0;
    for (size_t cut = 0; cut <= size && bad < 5; cut++) {
        kv_trace *t = load_mem(full, cut, &err);
        if (cut < end[0]) {
            header_refused += t == NULL && err.code == KV_ERR_FORMAT;
            kv_trace_free(t);
            continue;
        }
        int k = 0;
        while (k < n && end[k + 1] <= cut) k++;
        int whole = cut == end[k];
        int ok = t && kv_trace_n_frames(t) == k && kv_trace_truncated(t) == !whole &&
                 (whole ? !kv_trace_end_note(t)[0] : strstr(kv_trace_end_note(t), "cut off") != NULL);
        if (ok && k > 0) ok = snap_equal(kv_trace_frame(t, k - 1), r->snaps[k - 1], k - 1);
        if (!ok) {
            bad++;
            fprintf(stderr, "  cut at %zu of %zu: %d frames (want %d), %s\n", cut, size, kv_trace_n_frames(t), k,
                    t ? kv_trace_end_note(t) : err.msg);
        }
        mid += !whole;
        kv_trace_free(t);
    }
    CHECKF(bad == 0 && header_refused == (int)end[0] && mid == (int)(size - end[0]) - n, "%d bad cuts", bad);
    /* every frame of a cut file, not just the last, and its export */
    size_t cut = end[n - 2] + (end[n - 1] - end[n - 2]) / 2;
    kv_trace *t = load_mem(full, cut, &err);
    REQUIRE(t && kv_trace_n_frames(t) == n - 2);
    for (int i = 0; i < n - 2; i++) CHECK(snap_equal(kv_trace_frame(t, i), r->snaps[i], i));
    char after[64];
    snprintf(after, sizeof after, "after frame %d (%d complete frames)", n - 3, n - 2);
    CHECKF(strstr(kv_trace_end_note(t), after) != NULL, "%s", kv_trace_end_note(t));
    CHECK(kv_trace_export_chrome(t, json, &err) == 0);
    chrome_counts cc;
    CHECK(chrome_count(json, &cc) == 0 && cc.counters == 2 * (n - 2) && cc.steps > 0);
    kv_trace_free(t);
    /* corrupt, not cut: the partial frame's marker or flags are wrong */
    char *bad_buf = malloc(size);
    REQUIRE(bad_buf);
    memcpy(bad_buf, full, size);
    memset(bad_buf + end[n - 2], 'x', 4);
    t = load_mem(bad_buf, cut, &err);
    CHECKF(t == NULL && strstr(err.msg, "bad frame marker"), "%s", t ? "loaded" : err.msg);
    kv_trace_free(t);
    memcpy(bad_buf, full, size);
    bad_buf[end[n - 2] + 4] = (char)0x80;
    t = load_mem(bad_buf, cut, &err);
    CHECKF(t == NULL && strstr(err.msg, "unknown flags"), "%s", t ? "loaded" : err.msg);
    kv_trace_free(t);
    free(bad_buf);
    free(full);
    free(end);
    for (int i = 0; i < r->n; i++) kv_snapshot_free(r->snaps[i]);
    free(r);
    unlink(json);
    unlink(path);
}

static void setup(void) { REQUIRE(mkdtemp(dir)); }
static void teardown(void) { rmdir(dir); }

TEST_MAIN(T(setup), T(test_roundtrip), T(test_random_run), T(test_bad_files), T(test_decision_counts), T(test_restart_same_step),
          T(test_big_map), T(test_cut_recording), T(teardown))
