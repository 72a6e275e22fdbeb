/* remote_chat.c - a streamed chat completion on its own thread; the UI
 * thread polls it for text and timings. */
#include "remote_chat.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/vec.h"
#include "../engine/json.h"
#include "http_client.h"

#define GAP_CAP 1024

struct kv_remote_chat {
    char url[700];
    char key[512];
    char *body;
    size_t body_len;
    pthread_t thread;
    int started;
    atomic_int stop;
    pthread_mutex_t mu;          /* guards what follows */
    char *text;                  /* received, not yet taken */
    size_t len, cap;
    kv_remote_chat_news news;    /* n_gaps / gaps_ms unused here: see gaps */
    double gaps[GAP_CAP];        /* not yet taken */
    int n_gaps;
    double t0_s, last_s;         /* request start, last delta (monotonic) */
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

char *kv_remote_chat_body(const kv_remote_chat_params *p, const char *model, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_json_field_str(&w, "model", model);
    kv_json_field_bool(&w, "stream", 1);
    kv_json_field_int(&w, "max_tokens", p->max_tokens);
    if (p->temperature >= 0) {
        kv_json_field_num(&w, "temperature", p->temperature);
    }
    kv_json_write_key(&w, "messages");
    kv_json_write_begin_array(&w);
    for (int i = 0; i < p->n; i++) {
        kv_json_write_begin_object(&w);
        kv_json_field_str(&w, "role", p->roles[i]);
        kv_json_field_str(&w, "content", p->texts[i]);
        kv_json_write_end_object(&w);
    }
    kv_json_write_end_array(&w);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

int kv_remote_chat_event(const char *data, size_t len, kv_remote_chat_news *news,
                         void (*append)(void *user, const char *text, size_t len), void *user) {
    while (len && (*data == ' ' || *data == '\t')) data++, len--;
    if (len >= 6 && !memcmp(data, "[DONE]", 6)) return 1;
    kv_err err;
    kv_json *j = kv_json_parse(data, len, &err);
    if (!j) {
        snprintf(news->error, sizeof news->error, "bad chunk: %.200s", err.msg);
        return KV_ERR_FORMAT;
    }
    int rc = 0;
    const kv_json *e = kv_json_get(j, "error");
    if (e) {
        const char *m = kv_json_str(kv_json_get(e, "message"), NULL);
        snprintf(news->error, sizeof news->error, "server error: %.200s", m ? m : kv_json_str(e, NULL) ? kv_json_str(e, NULL) : "?");
        rc = KV_ERR_FORMAT;
        goto done;
    }
    const kv_json *ch = kv_json_get(j, "choices");
    if (kv_json_type_of(ch) != KV_JSON_ARRAY) {
        snprintf(news->error, sizeof news->error, "bad chunk: no choices array");
        rc = KV_ERR_FORMAT;
        goto done;
    }
    const kv_json *c0 = kv_json_at(ch, 0);
    size_t tl = 0;
    const char *t = kv_json_str(kv_json_get(kv_json_get(c0, "delta"), "content"), &tl);
    if (t && tl) append(user, t, tl);
    const char *fin = kv_json_str(kv_json_get(c0, "finish_reason"), NULL);
    if (fin) kv_copy_str(news->finish, sizeof news->finish, fin);
    const kv_json *tm = kv_json_get(j, "timings");
    if (kv_json_type_of(kv_json_get(tm, "cache_n")) == KV_JSON_NUMBER)
        news->cache_n = (int)kv_json_number(kv_json_get(tm, "cache_n"));
    if (kv_json_type_of(kv_json_get(tm, "prompt_n")) == KV_JSON_NUMBER)
        news->prompt_n = (int)kv_json_number(kv_json_get(tm, "prompt_n"));
done:
    kv_json_free(j);
    return rc;
}

/* The stream thread's append: text under the lock, with its timing. */
static void on_text(void *user, const char *text, size_t n) {
    kv_remote_chat *c = user;
    double now = mono_s();
    pthread_mutex_lock(&c->mu);
    if (!kv_grow_size((void **)&c->text, &c->cap, c->len + n, 1)) {
        memcpy(c->text + c->len, text, n);
        c->len += n;
    }
    if (c->news.n_deltas == 0) c->news.ttft_ms = (now - c->t0_s) * 1000.0;
    else if (c->n_gaps < GAP_CAP) c->gaps[c->n_gaps++] = (now - c->last_s) * 1000.0;
    c->last_s = now;
    c->news.n_deltas++;
    pthread_mutex_unlock(&c->mu);
}

static int on_event(void *user, const char *data, size_t len) {
    kv_remote_chat *c = user;
    kv_remote_chat_news tmp;
    pthread_mutex_lock(&c->mu);
    tmp = c->news;
    pthread_mutex_unlock(&c->mu);
    int rc = kv_remote_chat_event(data, len, &tmp, on_text, c);
    pthread_mutex_lock(&c->mu);
    kv_copy_str(c->news.finish, sizeof c->news.finish, tmp.finish);
    kv_copy_str(c->news.error, sizeof c->news.error, tmp.error);
    c->news.cache_n = tmp.cache_n;
    c->news.prompt_n = tmp.prompt_n;
    pthread_mutex_unlock(&c->mu);
    return rc != 0; /* [DONE] or an error chunk ends it */
}

static void *chat_main(void *arg) {
    kv_remote_chat *c = arg;
    kv_http_opts o = kv_http_default_opts();
    o.api_key = c->key[0] ? c->key : NULL;
    o.stop = &c->stop;
    o.idle_timeout_ms = 300000; /* a queued request, or one on a paused engine, may wait long for a token */
    kv_err err;
    long status = 0;
    int rc = kv_http_sse(c->url, c->body, c->body_len, &o, on_event, c, &status, &err);
    pthread_mutex_lock(&c->mu);
    if (rc && rc != KV_AGAIN && !c->news.error[0]) kv_copy_str(c->news.error, sizeof c->news.error, err.msg);
    if (rc == 0 && !c->news.finish[0] && !c->news.error[0])
        kv_copy_str(c->news.error, sizeof c->news.error, "the stream ended without a finish_reason");
    c->news.done = 1;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

kv_remote_chat *kv_remote_chat_start(kv_source *src, const kv_remote_chat_params *p, kv_err *err) {
    char model[128];
    kv_source_model(src, model, sizeof model);
    kv_remote_chat *c = calloc(1, sizeof *c);
    if (!c) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->body = kv_remote_chat_body(p, model[0] ? model : "default", &c->body_len);
    if (!c->body || kv_http_join(c->url, sizeof c->url, kv_source_url(src), "/v1/chat/completions")) {
        free(c->body);
        free(c);
        kv_err_set(err, KV_ERR_NOMEM, "cannot build the request");
        return NULL;
    }
    kv_copy_str(c->key, sizeof c->key, kv_source_key(src));
    pthread_mutex_init(&c->mu, NULL);
    c->news.ttft_ms = -1;
    c->news.cache_n = c->news.prompt_n = -1;
    c->t0_s = c->last_s = mono_s();
    if (pthread_create(&c->thread, NULL, chat_main, c)) {
        pthread_mutex_destroy(&c->mu);
        free(c->body);
        free(c);
        kv_err_set(err, KV_ERR_NOMEM, "cannot start a thread");
        return NULL;
    }
    c->started = 1;
    return c;
}

size_t kv_remote_chat_poll(kv_remote_chat *c, char *buf, size_t cap, kv_remote_chat_news *news) {
    pthread_mutex_lock(&c->mu);
    size_t n = c->len < cap ? c->len : cap;
    if (n) {
        memcpy(buf, c->text, n);
        memmove(c->text, c->text + n, c->len - n);
    }
    c->len -= n;
    *news = c->news;
    int g = c->n_gaps < 64 ? c->n_gaps : 64;
    if (g) memcpy(news->gaps_ms, c->gaps, (size_t)g * sizeof(double));
    memmove(c->gaps, c->gaps + g, (size_t)(c->n_gaps - g) * sizeof(double));
    c->n_gaps -= g;
    news->n_gaps = g;
    /* done only once everything was taken */
    if (c->len || c->n_gaps) news->done = 0;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void kv_remote_chat_cancel(kv_remote_chat *c) {
    if (c) atomic_store(&c->stop, 1);
}

void kv_remote_chat_free(kv_remote_chat *c) {
    if (!c) return;
    if (c->started) {
        atomic_store(&c->stop, 1);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->text);
    free(c->body);
    free(c);
}
