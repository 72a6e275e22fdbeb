/* kvtop_api.c - the endpoints beside generation: /health, /v1/models,
 * /tokenize, /detokenize, /metrics, and kvtop's own /kvtop/v1/snapshot,
 * /kvtop/v1/stream (snapshot frames as Server-Sent Events) and
 * /kvtop/v1/control (pause, resume, step, slow motion). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/common.h"
#include "../engine/json.h"
#include "../engine/tokenizer.h"
#include "metrics_prom.h"
#include "prompt.h"
#include "snapshot_json.h"
#include "srv.h"

static void reply_nomem(srv_reply *r) {
    srv_error e;
    srv_fail(&e, 500, "internal_error", NULL, "out_of_memory", "out of memory");
    srv_reply_error(r, &e);
}

/* Finishes j as a JSON reply of status. */
static void json_done(srv_json *j, int status, srv_reply *r) {
    size_t len;
    char *body = srv_json_close(j, &len);
    if (!body) {
        reply_nomem(r);
        return;
    }
    srv_reply_json(r, status, body, len);
}

void srv_handle_health(srv *s, srv_reply *r) {
    int st = atomic_load(&s->state);
    srv_json j;
    if (srv_json_open(&j)) {
        reply_nomem(r);
        return;
    }
    kv_json_write_begin_object(&j.w);
    kv_json_write_key(&j.w, "status");
    kv_json_write_string(&j.w, st == SRV_READY      ? "ok"
                               : st == SRV_LOADING  ? "loading"
                               : st == SRV_STOPPING ? "shutting_down"
                                                    : "failed");
    if (st == SRV_FAILED) {
        kv_json_field_str(&j.w, "error", s->load_error);
    }
    kv_json_write_end_object(&j.w);
    json_done(&j, st == SRV_READY ? 200 : 503, r);
}

void srv_handle_models(srv *s, srv_reply *r) {
    srv_json j;
    if (srv_json_open(&j)) {
        reply_nomem(r);
        return;
    }
    kv_json_writer *w = &j.w;
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "object", "list");
    kv_json_write_key(w, "data");
    kv_json_write_begin_array(w);
    kv_json_write_begin_object(w);
    kv_json_field_str(w, "id", s->model_id);
    kv_json_field_str(w, "object", "model");
    kv_json_field_int(w, "created", (int64_t)time(NULL));
    kv_json_field_str(w, "owned_by", "kvtop");
    kv_json_field_str(w, "root", s->cfg.model.path);
    kv_json_field_int(w, "max_model_len", s->ctx);
    srv_write_warnings(w, s->warnings, s->n_warnings); /* kvtop's: what loading the model had to guess */
    kv_json_write_end_object(w);
    kv_json_write_end_array(w);
    kv_json_write_end_object(w);
    json_done(&j, 200, r);
}

void srv_handle_tokenize(srv *s, const char *body, size_t len, srv_reply *r) {
    srv_tok_req q;
    srv_error e;
    if (srv_parse_tokenize(body, len, &q, &e)) {
        srv_reply_error(r, &e);
        return;
    }
    const kv_model *m = kv_engine_model(s->e);
    int32_t *ids = NULL;
    int n = 0, rc;
    kv_err err;
    if (!srv_model_ok(s, q.model)) {
        srv_fail(&e, 404, NULL, "model", "model_not_found", "the model '%s' does not exist", q.model);
        srv_reply_error(r, &e);
        srv_tok_req_free(&q);
        return;
    }
    size_t max_piece = (size_t)KV_MAX(kv_tokenizer_max_piece(m->tok), 1);
    size_t bytes = q.prompt ? q.len : 0;
    for (int i = 0; i < q.n_msgs; i++) bytes += q.msgs[i].len;
    if (bytes / max_piece > (size_t)s->ctx) {
        srv_fail(&e, 400, NULL, q.prompt ? "prompt" : "messages", "context_length_exceeded",
                 "the text (%zu bytes) is longer than the model's context of %d tokens", bytes, s->ctx);
        srv_reply_error(r, &e);
        srv_tok_req_free(&q);
        return;
    }
    if (q.prompt) rc = srv_prompt_text(m, q.prompt, q.len, q.add_special, q.parse_special, s->ctx, &ids, &n, &err);
    else rc = srv_prompt_chat(m, q.msgs, q.n_msgs, q.add_generation_prompt, q.parse_special, s->ctx, &ids, &n, &err);
    srv_tok_req_free(&q);
    if (rc) {
        srv_fail(&e, 400, NULL, "prompt", NULL, "%s", err.msg);
        srv_reply_error(r, &e);
        return;
    }
    srv_json j;
    if (srv_json_open(&j)) {
        free(ids);
        reply_nomem(r);
        return;
    }
    kv_json_write_begin_object(&j.w);
    kv_json_field_int(&j.w, "count", n);
    kv_json_field_int(&j.w, "max_model_len", s->ctx);
    kv_json_write_key(&j.w, "tokens");
    kv_json_write_begin_array(&j.w);
    for (int i = 0; i < n; i++) kv_json_write_int(&j.w, ids[i]);
    kv_json_write_end_array(&j.w);
    kv_json_write_end_object(&j.w);
    free(ids);
    json_done(&j, 200, r);
}

void srv_handle_detokenize(srv *s, const char *body, size_t len, srv_reply *r) {
    srv_detok_req q;
    srv_error e;
    if (srv_parse_detokenize(body, len, &q, &e)) {
        srv_reply_error(r, &e);
        return;
    }
    const kv_model *m = kv_engine_model(s->e);
    int nv = kv_tokenizer_n_vocab(m->tok);
    for (int i = 0; i < q.n_ids; i++)
        if (q.ids[i] >= nv) {
            char p[32];
            snprintf(p, sizeof p, "tokens[%d]", i);
            srv_fail(&e, 400, NULL, p, "invalid_value", "token id %d is outside the vocabulary [0, %d)", q.ids[i], nv);
            srv_reply_error(r, &e);
            srv_detok_req_free(&q);
            return;
        }
    int need = kv_tokenizer_decode(m->tok, q.ids, q.n_ids, 0, NULL, 0);
    char *text = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (!text) {
        srv_detok_req_free(&q);
        reply_nomem(r);
        return;
    }
    kv_tokenizer_decode(m->tok, q.ids, q.n_ids, 0, text, (size_t)need + 1);
    srv_detok_req_free(&q);
    srv_json j;
    if (srv_json_open(&j)) {
        free(text);
        reply_nomem(r);
        return;
    }
    kv_json_write_begin_object(&j.w);
    kv_json_write_key(&j.w, "prompt");
    kv_json_write_string_n(&j.w, text, (size_t)need);
    kv_json_write_end_object(&j.w);
    free(text);
    json_done(&j, 200, r);
}

void srv_handle_metrics(srv *s, srv_reply *r) {
    kv_snapshot *snap = kv_snapshot_new();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!snap || !f || kv_engine_snapshot(s->e, snap)) {
        if (f) fclose(f);
        free(buf);
        kv_snapshot_free(snap);
        reply_nomem(r);
        return;
    }
    srv_stats st;
    srv_hub_stats(s->hub, &st);
    int rc = srv_metrics_write(f, s->cfg.server.metrics_prefix, s->model_id, snap, &st);
    fclose(f);
    kv_snapshot_free(snap);
    if (rc) {
        free(buf);
        reply_nomem(r);
        return;
    }
    r->status = 200;
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
    r->body = buf;
    r->len = len;
}

/* The snapshot as JSON text (malloc'd, *len) or NULL. */
static char *snapshot_text(srv *s, kv_snapshot *snap, const char *check, size_t *len) {
    if (kv_engine_snapshot(s->e, snap)) return NULL;
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    int rc = srv_snapshot_write_warned(f, snap, s->model_id, -1, check, s->warnings, s->n_warnings);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

void srv_handle_snapshot(srv *s, int check, srv_reply *r) {
    char msg[256] = "";
    if (check && kv_engine_check(s->e, msg, sizeof msg) != 0 && !msg[0]) kv_copy_str(msg, sizeof msg, "check failed");
    kv_snapshot *snap = kv_snapshot_new();
    size_t len = 0;
    char *text = snap ? snapshot_text(s, snap, check ? msg : NULL, &len) : NULL;
    kv_snapshot_free(snap);
    if (!text) {
        reply_nomem(r);
        return;
    }
    srv_reply_json(r, 200, text, len);
}

/* ---- the snapshot stream ---- */

typedef struct snap_stream {
    srv_stream base;
    srv *s;
    kv_snapshot *snap;
    int interval_ms;    /* between frames; 0: a frame whenever the step count moves */
    int max_frames;     /* frames to send, then end; -1 = unbounded */
    int frames;         /* sent */
    int64_t last_step;  /* step of the last frame; -1 before the first */
    uint64_t next_ms;   /* monotonic time the next frame is due */
} snap_stream;

static uint64_t mono_ms(void) { return kv_now_ns() / 1000000u; }

static int snap_next(srv_stream *st, srv_buf *out, int wait_ms) {
    snap_stream *ss = (snap_stream *)st;
    if (ss->max_frames >= 0 && ss->frames >= ss->max_frames) return -1;
    if (atomic_load(&ss->s->state) == SRV_STOPPING) return -1;
    uint64_t now = mono_ms();
    if (now < ss->next_ms) {
        uint64_t d = ss->next_ms - now;
        struct timespec ts = {0, (long)(d < (uint64_t)wait_ms ? d : (uint64_t)wait_ms) * 1000000L};
        nanosleep(&ts, NULL);
        if (mono_ms() < ss->next_ms) return 0;
    }
    /* interval 0: poll every 10 ms and send when a step was taken */
    ss->next_ms = mono_ms() + (uint64_t)(ss->interval_ms > 0 ? ss->interval_ms : 10);
    if (kv_engine_snapshot(ss->s->e, ss->snap)) return -1;
    if (ss->interval_ms == 0 && ss->last_step >= 0 && (int64_t)ss->snap->step == ss->last_step) return 0;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return -1;
    int rc = srv_snapshot_write_warned(f, ss->snap, ss->s->model_id, ss->last_step, NULL, ss->s->warnings,
                                       ss->s->n_warnings);
    fclose(f);
    if (rc || srv_buf_add(out, "data: ", 6) || srv_buf_add(out, buf, len) || srv_buf_add(out, "\n\n", 2)) {
        free(buf);
        return -1;
    }
    free(buf);
    ss->last_step = (int64_t)ss->snap->step;
    ss->frames++;
    return (int)len;
}

static int snap_wait(srv_stream *st, srv_reply *r, int wait_ms) { return 1; }

static void snap_destroy(srv_stream *st, int client_gone) {
    snap_stream *ss = (snap_stream *)st;
    if (!ss) return;
    kv_snapshot_free(ss->snap);
    free(ss);
}

void srv_handle_stream(srv *s, int interval_ms, int max_frames, srv_reply *r) {
    snap_stream *ss = calloc(1, sizeof *ss);
    if (!ss || !(ss->snap = kv_snapshot_new())) {
        free(ss);
        reply_nomem(r);
        return;
    }
    ss->base = (srv_stream){snap_next, snap_wait, snap_destroy, NULL};
    ss->s = s;
    ss->interval_ms = interval_ms < 0 ? 500 : interval_ms;
    ss->max_frames = max_frames;
    ss->last_step = -1;
    r->status = 200;
    r->content_type = "text/event-stream";
    r->stream = &ss->base;
}

void srv_handle_control(srv *s, const char *body, size_t len, srv_reply *r) {
    srv_ctl_req q;
    srv_error e;
    if (srv_parse_control(body, len, &q, &e)) {
        srv_reply_error(r, &e);
        return;
    }
    switch (q.action) {
    case SRV_CTL_PAUSE: kv_engine_pause(s->e); break;
    case SRV_CTL_RESUME: kv_engine_resume(s->e); break;
    case SRV_CTL_STEP:
        kv_engine_pause(s->e);
        kv_engine_step_once(s->e);
        break;
    case SRV_CTL_SLOW: kv_engine_set_step_delay(s->e, q.delay_ms); break;
    }
    kv_snapshot *snap = kv_snapshot_new();
    if (!snap || kv_engine_snapshot(s->e, snap)) {
        kv_snapshot_free(snap);
        reply_nomem(r);
        return;
    }
    srv_json j;
    if (srv_json_open(&j)) {
        kv_snapshot_free(snap);
        reply_nomem(r);
        return;
    }
    kv_json_write_begin_object(&j.w);
    kv_json_field_bool(&j.w, "paused", snap->paused);
    kv_json_field_uint(&j.w, "step", snap->step);
    kv_json_field_int(&j.w, "step_delay_ms", snap->step_delay_ms);
    kv_json_write_end_object(&j.w);
    kv_snapshot_free(snap);
    json_done(&j, 200, r);
}
