/* util.c - the small shared pieces of the server: the byte buffer, error
 * and JSON replies, and the stream calls' dispatch. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/json.h"
#include "srv.h"

int srv_buf_add(srv_buf *b, const void *s, size_t n) {
    if (n == 0) return 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) return KV_ERR_NOMEM;
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) return KV_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int srv_buf_addf(srv_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return KV_ERR_INVAL;
    if ((size_t)n < sizeof small) return srv_buf_add(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return KV_ERR_NOMEM;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = srv_buf_add(b, big, (size_t)n);
    free(big);
    return rc;
}

void srv_buf_free(srv_buf *b) {
    if (!b) return;
    free(b->p);
    memset(b, 0, sizeof *b);
}

void srv_reply_json(srv_reply *r, int status, char *body, size_t len) {
    r->status = status;
    r->content_type = "application/json";
    r->body = body;
    r->len = len;
}

void srv_reply_error(srv_reply *r, const srv_error *e) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        kv_json_writer w;
        kv_json_writer_init(&w, f, 0);
        kv_json_write_begin_object(&w);
        kv_json_write_key(&w, "error");
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "message", e->message);
        kv_json_field_str(&w, "type", e->type);
        kv_json_field_str(&w, "param", e->param[0] ? e->param : NULL);
        kv_json_field_str(&w, "code", e->code[0] ? e->code : NULL);
        kv_json_write_end_object(&w);
        kv_json_write_end_object(&w);
        kv_json_writer_finish(&w);
        fclose(f);
    }
    r->status = e->status;
    r->content_type = "application/json";
    r->body = buf;
    r->len = buf ? len : 0;
    r->retry_after = e->status == 429 || e->status == 503 ? 1 : 0;
}

int srv_json_open(srv_json *j) {
    memset(j, 0, sizeof *j);
    j->f = open_memstream(&j->buf, &j->len);
    if (!j->f) return KV_ERR_NOMEM;
    kv_json_writer_init(&j->w, j->f, 0);
    return 0;
}

char *srv_json_close(srv_json *j, size_t *len) {
    int rc = kv_json_writer_finish(&j->w);
    fclose(j->f);
    if (rc) {
        free(j->buf);
        return NULL;
    }
    *len = j->len;
    return j->buf;
}

int srv_model_ok(const srv *s, const char *name) {
    const kv_model *m = kv_engine_model(s->e);
    return !name[0] || !strcmp(name, s->model_id) || !strcmp(name, m->name) || !strcmp(name, s->cfg.model.path);
}

int srv_stream_next(srv_stream *st, srv_buf *out, int wait_ms) { return st->next(st, out, wait_ms); }

int srv_stream_wait(srv_stream *st, srv_reply *r, int wait_ms) { return st->wait(st, r, wait_ms); }

void srv_stream_free(srv_stream *st, int client_gone) {
    if (st) st->destroy(st, client_gone);
}
