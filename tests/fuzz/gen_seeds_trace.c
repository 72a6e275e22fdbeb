/* gen_seeds_trace.c - writes the seed corpus for fuzz_trace with the trace
 * writer (format 2; each file under 64 KiB, the fuzzer's -max_len): a few
 * frames, a run past the second keyframe with requests and blocks coming
 * and going, and an engine restart with decisions between steps. Not part
 * of any build; run by hand after changing the format code:
 *   cc -std=c11 -D_GNU_SOURCE -o /tmp/gen tests/fuzz/gen_seeds_trace.c \
 *      engine/trace.c engine/json.c base/common.c -lm
 *   /tmp/gen tests/fuzz/seeds/fuzz_trace */
#include <stdio.h>
#include <string.h>

#include "../../engine/trace.h"

enum { REQS = 6, BLOCKS = 24, HIST = 512 };

/* A tiny engine whose state moves a little every step. */
typedef struct toy {
    uint64_t step;
    kv_snap_request req[REQS];
    int n_req;
    int32_t tables[REQS * 4];
    int64_t run[REQS], wait[REQS];
    kv_snap_block blocks[BLOCKS];
    kv_step_record steps[HIST];
    int n_steps;
    kv_decision dec[HIST];
    int n_dec;
    kv_snapshot s;
} toy;

static void toy_reset(toy *t) {
    memset(t, 0, sizeof *t);
    for (int b = 0; b < BLOCKS; b++) t->blocks[b].owner = t->blocks[b].session = -1;
}

static void toy_decide(toy *t, uint64_t step, kv_decision_kind kind, const char *text) {
    if (t->n_dec >= HIST) return;
    kv_decision *d = &t->dec[t->n_dec++];
    memset(d, 0, sizeof *d);
    d->step = step;
    d->kind = kind;
    d->req = t->n_req ? t->req[0].id : 0;
    snprintf(d->text, sizeof d->text, "%s", text);
}

static void toy_step(toy *t) {
    t->step++;
    uint64_t k = t->step;
    if (k % 9 == 1 && t->n_req < REQS) {
        kv_snap_request *q = &t->req[t->n_req++];
        memset(q, 0, sizeof *q);
        q->id = (int64_t)k;
        q->session = (int)(k % 3);
        q->n_prompt = 5 + (int)(k % 7);
        q->ttft_ms = q->e2e_ms = -1;
        snprintf(q->wait_reason, sizeof q->wait_reason, "%d free blocks, needs %d", (int)(k % 5), 9);
        toy_decide(t, k, KV_DEC_ADMIT, "admit");
    }
    if (k % 13 == 0 && t->n_req > 0) {
        memmove(&t->req[0], &t->req[1], (size_t)(t->n_req - 1) * sizeof t->req[0]);
        t->n_req--;
        toy_decide(t, k, KV_DEC_FINISH, "finish");
    }
    for (int i = 0; i < t->n_req; i++) {
        t->req[i].state = KV_REQ_RUNNING;
        t->req[i].n_generated++;
        t->req[i].n_blocks = 1 + (t->req[i].n_generated / 4) % 4;
    }
    kv_snap_block *b = &t->blocks[k % BLOCKS];
    b->state = (uint8_t)(1 + k % 2);
    b->fill = (uint16_t)(k % 17);
    b->refcount = 1;
    b->owner = (int32_t)k;
    b->session = (int32_t)(k % 3);
    if (t->n_steps < HIST) {
        kv_step_record *r = &t->steps[t->n_steps++];
        memset(r, 0, sizeof *r);
        r->step = k;
        r->t_ms = 2.0 * (double)k;
        r->dur_ms = r->forward_ms = 1.5;
        r->n_seqs = t->n_req;
        r->n_decode_tokens = t->n_req;
    }
}

static const kv_snapshot *toy_snapshot(toy *t) {
    kv_snapshot *s = &t->s;
    memset(s, 0, sizeof *s);
    s->step = t->step;
    s->now_ms = 2.0 * (double)t->step + 1.0;
    snprintf(s->model_name, sizeof s->model_name, "stories260K");
    snprintf(s->backend, sizeof s->backend, "cpu");
    s->block_size = 16;
    s->blocks_used = (int)(t->step % BLOCKS);
    int nt = 0;
    for (int i = 0; i < t->n_req; i++) {
        t->req[i].table_offset = nt;
        for (int j = 0; j < t->req[i].n_blocks; j++) t->tables[nt++] = (int32_t)((t->req[i].id + j) % BLOCKS);
        t->run[i] = t->req[i].id;
    }
    s->n_requests = t->n_req, s->requests = t->req;
    s->n_table_entries = nt, s->tables = t->tables;
    s->n_running = t->n_req, s->running = t->run;
    s->n_waiting = 0, s->waiting = t->wait;
    s->n_blocks = BLOCKS, s->blocks = t->blocks;
    s->n_steps = t->n_steps < 256 ? t->n_steps : 256;
    s->steps = t->steps + t->n_steps - s->n_steps;
    s->n_decisions = t->n_dec;
    s->decisions = t->dec;
    return s;
}

static int write_seed(const char *dir, const char *name, int frames, int restart_at) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    kv_err err;
    kv_trace_writer *w = kv_trace_writer_open(path, "model:\n  path: stories260K.gguf\n", &err);
    if (!w) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static toy t;
    toy_reset(&t);
    for (int f = 0; f < frames; f++) {
        if (f == restart_at) toy_reset(&t);
        if (f % 5 == 4) toy_decide(&t, t.step, KV_DEC_REJECT, "reject: between steps");
        toy_step(&t);
        if (kv_trace_writer_add(w, toy_snapshot(&t)) < 0) break;
    }
    int rc = kv_trace_writer_close(w);
    if (rc) fprintf(stderr, "error writing %s\n", path);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds_trace DIR\n");
        return 2;
    }
    int rc = write_seed(argv[1], "three_frames.kvtrace", 3, -1);
    rc |= write_seed(argv[1], "two_keyframes.kvtrace", 70, -1);
    rc |= write_seed(argv[1], "restart.kvtrace", 20, 12);
    return rc;
}
