/* http_client.c - bounded HTTP requests and SSE streams on libcurl's easy
 * interface, one transfer per call, for the attach sources' threads. */
#include "http_client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/vec.h"

int kv_http_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : KV_ERR_IO; }
void kv_http_global_cleanup(void) { curl_global_cleanup(); }

kv_http_opts kv_http_default_opts(void) {
    kv_http_opts o = {NULL, 2000, 5000, 5000, (size_t)16 << 20, NULL};
    return o;
}

void kv_http_resp_free(kv_http_resp *r) {
    if (!r) return;
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

int kv_http_join(char *out, size_t cap, const char *base, const char *path) {
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] == '/') bl--;
    int n = snprintf(out, cap, "%.*s%s", (int)bl, base, path);
    return n < 0 || (size_t)n >= cap ? KV_ERR_RANGE : 0;
}

/* ---- SSE ---- */

void kv_sse_init(kv_sse_parser *p, size_t max_bytes) {
    memset(p, 0, sizeof *p);
    p->max_bytes = max_bytes ? max_bytes : ((size_t)16 << 20);
}

void kv_sse_free(kv_sse_parser *p) {
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

/* One complete line (without its end). */
static int sse_line(kv_sse_parser *p, kv_sse_fn fn, void *user) {
    const char *l = p->line ? p->line : "";
    size_t n = p->line_len;
    if (n == 0) { /* blank line: dispatch */
        if (!p->have_data) return 0;
        p->have_data = 0;
        size_t len = p->data_len;
        p->data_len = 0;
        p->events++;
        return fn(user, p->data, len) ? 1 : 0;
    }
    if (l[0] == ':') return 0; /* comment */
    if (n < 5 || memcmp(l, "data", 4) || (l[4] != ':' && n != 4)) return 0; /* event:, id:, retry: unused */
    size_t off = 5;
    if (off < n && l[off] == ' ') off++;
    size_t add = n - off + (p->have_data ? 1 : 0);
    if (p->data_len + add + 1 > p->max_bytes) return KV_ERR_FORMAT;
    if (kv_grow_size((void **)&p->data, &p->data_cap, p->data_len + add + 1, 1)) return KV_ERR_NOMEM;
    if (p->have_data) p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, l + off, n - off);
    p->data_len += n - off;
    p->data[p->data_len] = 0;
    p->have_data = 1;
    return 0;
}

int kv_sse_feed(kv_sse_parser *p, const char *buf, size_t n, kv_sse_fn fn, void *user) {
    if (p->too_big) return KV_ERR_FORMAT;
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n') {
            if (p->line_len && p->line[p->line_len - 1] == '\r') p->line_len--;
            int rc = sse_line(p, fn, user);
            p->line_len = 0;
            if (rc == KV_ERR_FORMAT) p->too_big = 1;
            if (rc) return rc;
            continue;
        }
        if (p->line_len + 2 > p->max_bytes) {
            p->too_big = 1;
            return KV_ERR_FORMAT;
        }
        if (p->line_len + 2 > p->line_cap && kv_grow_size((void **)&p->line, &p->line_cap, p->line_len + 2, 1))
            return KV_ERR_NOMEM;
        p->line[p->line_len++] = c;
    }
    return 0;
}

/* ---- transfers ---- */

typedef struct xfer {
    const kv_http_opts *o;
    /* plain: the body read so far */
    char *buf;
    size_t len, cap;
    int too_big;             /* bool */
    /* streams */
    kv_sse_parser sse;
    kv_sse_fn fn;
    void *user;
    int sse_rc;              /* what the parser said last */
    long status;             /* from the headers, once known */
    CURL *h;
    double last_data_s;      /* monotonic time of the last bytes */
    int idle;                /* bool: ended for silence */
    int stopped;             /* bool: ended by *o->stop */
} xfer;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t n = size * nmemb;
    x->last_data_s = mono_s();
    if (x->len + n + 1 > x->o->max_bytes) {
        x->too_big = 1;
        return 0; /* ends the transfer (CURLE_WRITE_ERROR) */
    }
    if (kv_grow_size((void **)&x->buf, &x->cap, x->len + n + 1, 1)) return 0;
    memcpy(x->buf + x->len, ptr, n);
    x->len += n;
    x->buf[x->len] = 0;
    return n;
}

static size_t on_stream(char *ptr, size_t size, size_t nmemb, void *ud) {
    xfer *x = ud;
    size_t n = size * nmemb;
    x->last_data_s = mono_s();
    if (x->status == 0) curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status != 200) return on_body(ptr, size, nmemb, ud); /* an error body: keep its start */
    x->sse_rc = kv_sse_feed(&x->sse, ptr, n, x->fn, x->user);
    return x->sse_rc ? 0 : n;
}

/* Called often while a transfer runs: the stop flag and the idle timeout. */
static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    xfer *x = ud;
    if (x->o->stop && atomic_load(x->o->stop)) {
        x->stopped = 1;
        return 1;
    }
    if (x->fn && mono_s() - x->last_data_s > x->o->idle_timeout_ms / 1000.0) {
        x->idle = 1;
        return 1;
    }
    return 0;
}

static CURL *setup(xfer *x, const char *url, const char *body, size_t body_len, struct curl_slist **hdrs,
                   int stream) {
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    const kv_http_opts *o = x->o;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); /* the key stays with this URL */
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
    if (!stream) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)o->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream ? on_stream : on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kvtop-attach");
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, NULL);
    struct curl_slist *l = NULL;
    if (o->api_key && o->api_key[0]) {
        char auth[600];
        snprintf(auth, sizeof auth, "Authorization: Bearer %.500s", o->api_key);
        l = curl_slist_append(l, auth);
    }
    if (body) {
        l = curl_slist_append(l, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    if (stream) l = curl_slist_append(l, "Accept: text/event-stream");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
    *hdrs = l;
    x->h = h;
    x->last_data_s = mono_s();
    return h;
}

/* The message for a failed transfer. */
static int fail(const xfer *x, CURLcode cc, const char *url, kv_err *err) {
    if (x->stopped) return KV_AGAIN;
    if (x->too_big || x->sse_rc == KV_ERR_FORMAT)
        return kv_err_set(err, KV_ERR_IO, "%s: answer larger than %zu bytes", url, x->o->max_bytes);
    if (x->idle) return kv_err_set(err, KV_ERR_IO, "%s: no data for %d ms", url, x->o->idle_timeout_ms);
    return kv_err_set(err, KV_ERR_IO, "%s: %s", url, curl_easy_strerror(cc));
}

int kv_http_request(const char *url, const char *body, size_t body_len, const kv_http_opts *opts, kv_http_resp *r,
                    kv_err *err) {
    memset(r, 0, sizeof *r);
    xfer x;
    memset(&x, 0, sizeof x);
    x.o = opts;
    struct curl_slist *hdrs = NULL;
    CURL *h = setup(&x, url, body, body_len, &hdrs, 0);
    if (!h) return kv_err_set(err, KV_ERR_NOMEM, "%s: cannot start a transfer", url);
    CURLcode cc = curl_easy_perform(h);
    int rc = 0;
    if (cc != CURLE_OK) {
        rc = fail(&x, cc, url, err);
        free(x.buf);
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        char *ct = NULL;
        curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
        kv_copy_str(r->content_type, sizeof r->content_type, ct ? ct : "");
        r->body = x.buf;
        r->len = x.len;
        if (!r->body && (r->body = calloc(1, 1)) == NULL) rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return rc;
}

int kv_http_sse(const char *url, const char *body, size_t body_len, const kv_http_opts *opts, kv_sse_fn fn,
                void *user, long *status, kv_err *err) {
    xfer x;
    memset(&x, 0, sizeof x);
    x.o = opts;
    x.fn = fn;
    x.user = user;
    kv_sse_init(&x.sse, opts->max_bytes);
    struct curl_slist *hdrs = NULL;
    CURL *h = setup(&x, url, body, body_len, &hdrs, 1);
    if (!h) {
        kv_sse_free(&x.sse);
        return kv_err_set(err, KV_ERR_NOMEM, "%s: cannot start a transfer", url);
    }
    CURLcode cc = curl_easy_perform(h);
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    if (status) *status = st;
    int rc = 0;
    if (x.sse_rc == 1) rc = 0; /* fn asked to stop */
    else if (cc != CURLE_OK && !(st != 200 && st != 0 && x.too_big)) rc = fail(&x, cc, url, err);
    if (rc == 0 && x.sse_rc != 1 && st != 200)
        rc = kv_err_set(err, KV_ERR_IO, "%s: HTTP %ld: %.200s", url, st, x.buf ? x.buf : "");
    free(x.buf);
    kv_sse_free(&x.sse);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return rc;
}
