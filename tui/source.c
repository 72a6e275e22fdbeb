/* source.c - a remote source's threads: the main one detects the kind,
 * learns the model from /v1/models and then follows a kvtop server's
 * /kvtop/v1/stream (or polls a metrics adapter), reconnecting after a
 * failure; the control one sends F2/F3/F4 to /kvtop/v1/control so a slow
 * answer never holds up the snapshots. */
#include "source_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/json.h"
#include "../engine/snapshot_parse.h"

static const char *const kind_names[KV_SOURCE_KIND_COUNT] = {"auto", "kvtop", "llamacpp", "vllm", "sglang", "tgi"};

const char *kv_source_kind_name(kv_source_kind k) {
    return (int)k >= 0 && k < KV_SOURCE_KIND_COUNT ? kind_names[k] : "?";
}

int kv_source_kind_parse(const char *s, kv_source_kind *out) {
    for (int i = 0; s && i < KV_SOURCE_KIND_COUNT; i++)
        if (!strcmp(s, kind_names[i])) {
            *out = (kv_source_kind)i;
            return 0;
        }
    return KV_ERR_INVAL;
}

const char *kv_source_na_reason(kv_source_kind kind, kv_source_field f) {
    switch (kind) {
    case KV_SOURCE_KVTOP: return NULL;
    case KV_SOURCE_VLLM:
        if (f == KV_SF_BLOCKS) return "vLLM exports no per-block state (--kv-events would show the prefix tree)";
        if (f == KV_SF_REQUESTS) return "vLLM exports no per-request rows";
        if (f == KV_SF_STEPS) return "vLLM exports no per-step records";
        if (f == KV_SF_MEMORY) return "vLLM exports KV usage only, no memory breakdown";
        if (f == KV_SF_CONTROL) return "vLLM has no pause/step endpoint";
        return NULL;
    case KV_SOURCE_SGLANG:
        if (f == KV_SF_BLOCKS) return "SGLang exports no per-block state";
        if (f == KV_SF_REQUESTS) return "SGLang exports no per-request rows";
        if (f == KV_SF_STEPS) return "SGLang exports no per-step records";
        if (f == KV_SF_MEMORY) return "SGLang exports token usage only, no memory breakdown";
        if (f == KV_SF_CONTROL) return "SGLang has no pause/step endpoint";
        return NULL;
    case KV_SOURCE_LLAMACPP:
        if (f == KV_SF_BLOCKS) return "llama.cpp has no paged block map (one contiguous cache per slot)";
        if (f == KV_SF_KV_USAGE) return "llama.cpp removed its KV usage metric";
        if (f == KV_SF_LATENCY) return "llama.cpp exports no latency histograms (the tabs' own TTFT/TPOT shown)";
        if (f == KV_SF_STEPS) return "llama.cpp exports no per-step records";
        if (f == KV_SF_MEMORY) return "llama.cpp exports no memory breakdown";
        if (f == KV_SF_CONTROL) return "llama.cpp has no pause/step endpoint";
        if (f == KV_SF_REQUESTS) return NULL; /* one row per slot from /slots */
        return NULL;
    case KV_SOURCE_TGI:
        if (f == KV_SF_QUEUES || f == KV_SF_LATENCY || f == KV_SF_THROUGHPUT) return NULL;
        if (f == KV_SF_CONTROL) return "TGI has no pause/step endpoint";
        return "TGI exports queue, batch and latency histograms only";
    default: return "not connected yet";
    }
}

/* ---- helpers for the source's files ---- */

kv_http_opts source_opts(kv_source *s) {
    kv_http_opts o = kv_http_default_opts();
    o.api_key = s->key[0] ? s->key : NULL;
    o.stop = &s->stop;
    o.idle_timeout_ms = KV_MAX(3000, 4 * s->interval_ms);
    o.timeout_ms = KV_MAX(5000, 2 * s->interval_ms);
    return o;
}

void source_count_request(kv_source *s) {
    pthread_mutex_lock(&s->mu);
    s->st.requests++;
    pthread_mutex_unlock(&s->mu);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The fleet row of a source (lock held). */
static void summarize(kv_source *s) {
    kv_source_summary *o = &s->st.sum;
    const kv_snapshot *c = s->cur;
    const kv_remote_metrics *m = &s->st.m;
    if (s->st.kind == KV_SOURCE_KVTOP) {
        o->running = c->n_running;
        o->waiting = c->n_waiting;
        o->kv_pct = c->n_blocks > 0 ? 100.0 * c->blocks_used / c->n_blocks : NAN;
        o->tok_s = c->metrics.output_tokens_per_s;
        o->ttft_p99_ms = c->metrics.ttft_ms.valid ? c->metrics.ttft_ms.p99 : NAN;
        return;
    }
    o->running = (m->have & KV_RM_QUEUE) || (m->have & KV_RM_SLOTS) ? m->running : NAN;
    o->waiting = m->have & KV_RM_QUEUE ? m->waiting : NAN;
    o->kv_pct = m->have & KV_RM_KV_USAGE ? 100.0 * m->kv_usage : NAN;
    o->tok_s = m->have & KV_RM_TOKS ? m->gen_tok_s : NAN;
    o->ttft_p99_ms = m->have & KV_RM_TTFT ? m->ttft_ms[2] : NAN;
}

void source_publish(kv_source *s) {
    pthread_mutex_lock(&s->mu);
    summarize(s);
    if (kv_snapshot_copy(s->pub, s->cur) == 0) {
        s->seq++;
        s->st.frames++;
    }
    s->st.up = 1;
    s->st.last_ok_s = mono_s();
    s->st.error[0] = 0;
    pthread_mutex_unlock(&s->mu);
}

void source_set_error(kv_source *s, const char *msg) {
    pthread_mutex_lock(&s->mu);
    s->st.up = 0;
    kv_copy_str(s->st.error, sizeof s->st.error, msg);
    pthread_mutex_unlock(&s->mu);
}

void source_reject(kv_source *s, uint64_t n, const char *msg) {
    pthread_mutex_lock(&s->mu);
    s->st.rejected += n;
    kv_copy_str(s->st.rejected_msg, sizeof s->st.rejected_msg, msg);
    pthread_mutex_unlock(&s->mu);
}

int source_sleep(kv_source *s, int ms) {
    while (ms > 0 && !atomic_load(&s->stop)) {
        int d = ms < 20 ? ms : 20;
        struct timespec ts = {0, d * 1000000L};
        nanosleep(&ts, NULL);
        ms -= d;
    }
    return atomic_load(&s->stop) != 0;
}

/* A GET of base+path into r. 0 or an error (err). */
static int get(kv_source *s, const char *path, kv_http_resp *r, kv_err *err) {
    char url[700];
    if (kv_http_join(url, sizeof url, s->url, path)) return kv_err_set(err, KV_ERR_RANGE, "URL too long");
    kv_http_opts o = source_opts(s);
    source_count_request(s);
    return kv_http_request(url, NULL, 0, &o, r, err);
}

/* ---- detection and the model ---- */

/* kvtop when /kvtop/v1/snapshot answers a snapshot (or refuses the key:
 * only kvtop has that path); else what the metrics say. */
static kv_source_kind detect(kv_source *s, kv_err *err) {
    kv_http_resp r;
    if (get(s, "/kvtop/v1/snapshot", &r, err)) return KV_SOURCE_AUTO;
    int kvtop = (r.status == 200 && r.body[0] == '{' && strstr(r.body, "\"blocks\"")) ||
                ((r.status == 401 || r.status == 403) && strstr(r.body, "api"));
    kv_http_resp_free(&r);
    if (kvtop) return KV_SOURCE_KVTOP;
    kv_source_kind k = source_metrics_detect(s);
    if (k == KV_SOURCE_AUTO) kv_err_set(err, KV_ERR_FORMAT, "%s: not a kvtop, vLLM, SGLang, llama.cpp or TGI server", s->url);
    return k;
}

/* The served model: the first id of /v1/models. */
static void fetch_model(kv_source *s) {
    kv_http_resp r;
    kv_err err;
    if (get(s, "/v1/models", &r, &err)) return;
    kv_json *j = r.status == 200 ? kv_json_parse(r.body, r.len, &err) : NULL;
    const kv_json *id = kv_json_get(kv_json_at(kv_json_get(j, "data"), 0), "id");
    if (kv_json_type_of(id) == KV_JSON_STRING) {
        pthread_mutex_lock(&s->mu);
        kv_copy_str(s->st.model, sizeof s->st.model, kv_json_str(id, NULL));
        pthread_mutex_unlock(&s->mu);
    }
    kv_json_free(j);
    kv_http_resp_free(&r);
}

/* ---- the kvtop stream ---- */

static int on_frame(void *user, const char *data, size_t len) {
    kv_source *s = user;
    kv_err err;
    if (kv_snapshot_parse(data, len, s->cur, NULL, 0, &err)) {
        source_reject(s, 1, err.msg);
        return 0; /* one bad frame: the next full one repairs it */
    }
    source_publish(s);
    return 0;
}

static void follow_stream(kv_source *s) {
    char path[96], url[700];
    snprintf(path, sizeof path, "/kvtop/v1/stream?interval_ms=%d", s->interval_ms > 0 ? s->interval_ms : 100);
    if (kv_http_join(url, sizeof url, s->url, path)) {
        source_set_error(s, "URL too long");
        return;
    }
    kv_http_opts o = source_opts(s);
    kv_err err;
    long status = 0;
    source_count_request(s);
    int rc = kv_http_sse(url, NULL, 0, &o, on_frame, s, &status, &err);
    if (rc == KV_AGAIN) return;
    source_set_error(s, rc ? err.msg : "the server ended the stream");
}

static void *source_main(void *arg) {
    kv_source *s = arg;
    kv_source_kind kind = s->want;
    int backoff = 250;
    while (!atomic_load(&s->stop)) {
        if (kind == KV_SOURCE_AUTO) {
            kv_err err;
            kind = detect(s, &err);
            if (kind == KV_SOURCE_AUTO) {
                source_set_error(s, err.msg);
                if (source_sleep(s, backoff)) break;
                backoff = KV_MIN(backoff * 2, 2000);
                continue;
            }
            pthread_mutex_lock(&s->mu);
            s->st.kind = kind;
            s->st.valid = kind == KV_SOURCE_KVTOP ? KV_SF_ALL : s->st.valid;
            pthread_mutex_unlock(&s->mu);
        }
        if (!s->st.model[0]) fetch_model(s);
        double t0 = mono_s();
        if (kind == KV_SOURCE_KVTOP) {
            follow_stream(s);
        } else {
            source_metrics_poll(s);
            if (source_sleep(s, s->interval_ms > 0 ? s->interval_ms : 1000)) break;
            continue;
        }
        /* A stream that ran a while resets the backoff; a refused one grows it. */
        backoff = mono_s() - t0 > 5 ? 250 : KV_MIN(backoff * 2, 2000);
        if (source_sleep(s, backoff)) break;
    }
    return NULL;
}

/* ---- control ---- */

static void *control_main(void *arg) {
    kv_source *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!atomic_load(&s->stop)) {
        if (s->n_ctl == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        source_ctl c = s->ctl[0];
        memmove(&s->ctl[0], &s->ctl[1], (size_t)(s->n_ctl - 1) * sizeof s->ctl[0]);
        s->n_ctl--;
        s->st.requests++;
        pthread_mutex_unlock(&s->mu);
        char url[700], body[96], msg[160];
        if (c.delay_ms >= 0) snprintf(body, sizeof body, "{\"action\":\"%s\",\"delay_ms\":%d}", c.action, c.delay_ms);
        else snprintf(body, sizeof body, "{\"action\":\"%s\"}", c.action);
        kv_http_join(url, sizeof url, s->url, "/kvtop/v1/control");
        kv_http_opts o = source_opts(s);
        kv_http_resp r;
        kv_err err;
        if (kv_http_request(url, body, strlen(body), &o, &r, &err) == 0) {
            if (r.status == 200) snprintf(msg, sizeof msg, "remote %s: done", c.action);
            else snprintf(msg, sizeof msg, "remote %s: HTTP %ld %.100s", c.action, r.status, r.body);
            kv_http_resp_free(&r);
        } else {
            snprintf(msg, sizeof msg, "remote %s failed: %.120s", c.action, err.msg);
        }
        pthread_mutex_lock(&s->mu);
        kv_copy_str(s->st.control_msg, sizeof s->st.control_msg, msg);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int kv_source_control(kv_source *s, const char *action, int delay_ms) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->st.kind != KV_SOURCE_KVTOP) rc = KV_ERR_UNSUPPORTED;
    else if (s->n_ctl >= SOURCE_CTL_CAP) rc = KV_AGAIN;
    else {
        source_ctl *c = &s->ctl[s->n_ctl++];
        kv_copy_str(c->action, sizeof c->action, action);
        c->delay_ms = strcmp(action, "slow") ? -1 : KV_MAX(delay_ms, 0);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- lifecycle ---- */

kv_source *kv_source_new(const char *url, const char *key, kv_source_kind kind, int interval_ms, kv_err *err) {
    if (!url || (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))) {
        kv_err_set(err, KV_ERR_INVAL, "'%s' is not an http:// or https:// URL", url ? url : "");
        return NULL;
    }
    if (strlen(url) >= 500 || (key && strlen(key) >= 500) || strpbrk(url, " \t\r\n")) {
        kv_err_set(err, KV_ERR_INVAL, "URL or key too long, or the URL has white space");
        return NULL;
    }
    if (key && strpbrk(key, "\r\n")) {
        kv_err_set(err, KV_ERR_INVAL, "the API key has a line break");
        return NULL;
    }
    kv_source *s = calloc(1, sizeof *s);
    if (!s || !(s->pub = kv_snapshot_new()) || !(s->cur = kv_snapshot_new())) {
        if (s) kv_snapshot_free(s->pub);
        free(s);
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    kv_http_join(s->url, sizeof s->url, url, "");
    kv_copy_str(s->key, sizeof s->key, key ? key : "");
    s->want = kind;
    s->interval_ms = interval_ms <= 0 ? 0 : KV_MAX(interval_ms, 20);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->st.kind = kind;
    s->st.valid = kind == KV_SOURCE_KVTOP ? KV_SF_ALL : 0;
    kv_copy_str(s->st.url, sizeof s->st.url, s->url);
    return s;
}

int kv_source_start(kv_source *s) {
    if (pthread_create(&s->thread, NULL, source_main, s)) return KV_ERR_NOMEM;
    if (pthread_create(&s->ctl_thread, NULL, control_main, s)) {
        atomic_store(&s->stop, 1);
        pthread_join(s->thread, NULL);
        return KV_ERR_NOMEM;
    }
    s->started = 1;
    return 0;
}

void kv_source_free(kv_source *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        atomic_store(&s->stop, 1);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_join(s->ctl_thread, NULL);
    }
    source_metrics_free(s);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    kv_snapshot_free(s->pub);
    kv_snapshot_free(s->cur);
    free(s);
}

int kv_source_take(kv_source *s, kv_snapshot *out, uint64_t *seq, kv_source_status *st) {
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (out && s->seq != *seq) {
        rc = kv_snapshot_copy(out, s->pub) ? KV_ERR_NOMEM : 1;
        if (rc == 1) *seq = s->seq;
    }
    if (st) *st = s->st;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

const char *kv_source_url(const kv_source *s) { return s->url; }
const char *kv_source_key(const kv_source *s) { return s->key; }

void kv_source_model(kv_source *s, char *out, size_t cap) {
    pthread_mutex_lock(&s->mu);
    kv_copy_str(out, cap, s->st.model);
    pthread_mutex_unlock(&s->mu);
}

kv_source_kind kv_source_kind_of(kv_source *s) {
    pthread_mutex_lock(&s->mu);
    kv_source_kind k = s->st.kind;
    pthread_mutex_unlock(&s->mu);
    return k;
}
