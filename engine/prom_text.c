/* prom_text.c - Prometheus text format (version 0.0.4) line by line:
 * comments (# TYPE gives a family its type), then samples
 * `name{label="value",...} value [timestamp]`. A line that does not follow
 * the grammar is counted and skipped; the rest of the text still counts.
 * Histograms are gathered from their _bucket samples and read with
 * histogram_quantile's interpolation. */
#include "prom_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"

/* The # TYPE lines seen, so samples get their family's type. */
typedef struct family {
    char name[160];
    kv_prom_type type;
} family;
#define MAX_FAMILIES 1024

typedef struct cursor {
    const char *p, *end;
} cursor;

static int is_name_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
static int is_name_char(int c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
static void skip_blank(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t')) c->p++;
}

/* A metric or label name into out (cap); 0 or -1. */
static int read_name(cursor *c, char *out, size_t cap, int colon_ok) {
    size_t n = 0;
    if (c->p >= c->end || !is_name_start((unsigned char)*c->p) || (!colon_ok && *c->p == ':')) return -1;
    while (c->p < c->end && is_name_char((unsigned char)*c->p) && (colon_ok || *c->p != ':')) {
        if (n + 1 >= cap) return -1;
        out[n++] = *c->p++;
    }
    out[n] = 0;
    return 0;
}

/* A quoted label value with \\, \" and \n escapes. */
static int read_quoted(cursor *c, char *out, size_t cap) {
    if (c->p >= c->end || *c->p != '"') return -1;
    c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            if (c->p >= c->end) return -1;
            ch = *c->p++;
            if (ch == 'n') ch = '\n';
            else if (ch != '\\' && ch != '"') return -1;
        }
        if (n + 1 < cap) out[n++] = ch;
    }
    if (c->p >= c->end) return -1;
    c->p++;
    out[n] = 0;
    return 0;
}

/* A sample value: a float, NaN, +Inf or -Inf. */
static int read_value(cursor *c, double *out) {
    char buf[64];
    size_t n = 0;
    while (c->p < c->end && *c->p != ' ' && *c->p != '\t') {
        if (n + 1 >= sizeof buf) return -1;
        buf[n++] = *c->p++;
    }
    buf[n] = 0;
    if (n == 0) return -1;
    if (!strcmp(buf, "NaN")) *out = NAN;
    else if (!strcmp(buf, "+Inf") || !strcmp(buf, "Inf")) *out = INFINITY;
    else if (!strcmp(buf, "-Inf")) *out = -INFINITY;
    else {
        char *e;
        /* strtod also takes hex, "inf", "nan(...)": the format does not */
        for (size_t i = 0; i < n; i++)
            if (!strchr("0123456789+-.eE", buf[i])) return -1;
        *out = strtod(buf, &e);
        if (*e) return -1;
    }
    return 0;
}

static const char *sample_line(cursor *c, kv_prom_sample *s) {
    memset(s, 0, sizeof *s);
    if (read_name(c, s->name, sizeof s->name, 1)) return "bad metric name";
    if (c->p < c->end && *c->p == '{') {
        c->p++;
        for (;;) {
            skip_blank(c);
            if (c->p < c->end && *c->p == '}') {
                c->p++;
                break;
            }
            if (s->n_labels >= KV_PROM_MAX_LABELS) return "too many labels";
            kv_prom_label *l = &s->labels[s->n_labels++];
            if (read_name(c, l->name, sizeof l->name, 0)) return "bad label name";
            skip_blank(c);
            if (c->p >= c->end || *c->p != '=') return "expected '=' after a label name";
            c->p++;
            skip_blank(c);
            if (read_quoted(c, l->value, sizeof l->value)) return "bad label value";
            skip_blank(c);
            if (c->p < c->end && *c->p == ',') c->p++;
            else if (c->p < c->end && *c->p == '}') continue;
            else return "expected ',' or '}' in labels";
        }
    }
    if (c->p >= c->end || (*c->p != ' ' && *c->p != '\t')) return "expected a space before the value";
    skip_blank(c);
    if (read_value(c, &s->value)) return "bad value";
    skip_blank(c);
    if (c->p < c->end) { /* an optional integer timestamp */
        char *e;
        char buf[32];
        size_t n = (size_t)(c->end - c->p);
        if (n >= sizeof buf) return "bad timestamp";
        memcpy(buf, c->p, n);
        buf[n] = 0;
        strtoll(buf, &e, 10);
        if (*e || e == buf) return "bad timestamp";
    }
    return NULL;
}

/* "# TYPE name type" into fams; other comments are ignored. */
static const char *comment_line(cursor *c, family *fams, int *n_fams) {
    c->p++;
    skip_blank(c);
    if (c->end - c->p < 5 || memcmp(c->p, "TYPE", 4) || (c->p[4] != ' ' && c->p[4] != '\t')) return NULL;
    c->p += 4;
    skip_blank(c);
    family f;
    if (read_name(c, f.name, sizeof f.name, 1)) return "bad name in # TYPE";
    skip_blank(c);
    static const char *const types[] = {"untyped", "counter", "gauge", "histogram", "summary"};
    size_t n = (size_t)(c->end - c->p);
    while (n && (c->p[n - 1] == ' ' || c->p[n - 1] == '\t')) n--;
    for (int i = 0; i < 5; i++)
        if (strlen(types[i]) == n && !memcmp(c->p, types[i], n)) {
            f.type = (kv_prom_type)i;
            if (*n_fams < MAX_FAMILIES) fams[(*n_fams)++] = f;
            return NULL;
        }
    return "unknown type in # TYPE";
}

/* The family type of a sample name (its _bucket/_sum/_count/_total suffix
 * taken off when the bare name is not a family). */
static kv_prom_type type_of(const char *name, const family *fams, int n_fams) {
    static const char *const suffixes[] = {"", "_bucket", "_sum", "_count", "_total", "_created"};
    size_t len = strlen(name);
    for (size_t k = 0; k < KV_ARRAY_LEN(suffixes); k++) {
        size_t sl = strlen(suffixes[k]);
        if (sl > len || strcmp(name + len - sl, suffixes[k])) continue;
        for (int i = n_fams - 1; i >= 0; i--)
            if (strlen(fams[i].name) == len - sl && !strncmp(fams[i].name, name, len - sl)) return fams[i].type;
    }
    return KV_PROM_UNTYPED;
}

static void reject(kv_prom *p, int line, const char *why) {
    p->rejected++;
    if (!p->first_bad_line) {
        p->first_bad_line = line;
        snprintf(p->first_bad, sizeof p->first_bad, "line %d: %s", line, why);
    }
}

int kv_prom_parse(const char *text, size_t len, kv_prom *p, kv_err *err) {
    p->n = 0;
    p->lines = p->rejected = 0;
    p->first_bad_line = 0;
    p->first_bad[0] = 0;
    family *fams = malloc(MAX_FAMILIES * sizeof *fams);
    if (!fams) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    int n_fams = 0;
    const char *q = text, *end = text + len;
    while (q < end) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        const char *le = nl ? nl : end;
        cursor c = {q, le};
        if (le > q && le[-1] == '\r') c.end--;
        int line = (int)++p->lines;
        q = nl ? nl + 1 : end;
        skip_blank(&c);
        if (c.p == c.end) continue;
        if (memchr(c.p, 0, (size_t)(c.end - c.p))) {
            reject(p, line, "NUL byte");
            continue;
        }
        const char *why;
        if (*c.p == '#') {
            if ((why = comment_line(&c, fams, &n_fams))) reject(p, line, why);
            continue;
        }
        if (p->n >= KV_PROM_MAX_SAMPLES) {
            reject(p, line, "too many samples");
            continue;
        }
        if (kv_grow((void **)&p->samples, &p->cap, p->n + 1, sizeof *p->samples)) {
            free(fams);
            return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        }
        kv_prom_sample *s = &p->samples[p->n];
        if ((why = sample_line(&c, s))) {
            reject(p, line, why);
            continue;
        }
        s->type = type_of(s->name, fams, n_fams);
        p->n++;
    }
    free(fams);
    return 0;
}

void kv_prom_free(kv_prom *p) {
    if (!p) return;
    free(p->samples);
    p->samples = NULL;
    p->n = p->cap = 0;
}

const char *kv_prom_label_of(const kv_prom_sample *s, const char *name) {
    for (int i = 0; i < s->n_labels; i++)
        if (!strcmp(s->labels[i].name, name)) return s->labels[i].value;
    return NULL;
}

double kv_prom_sum_where(const kv_prom *p, const char *name, const char *label, const char *value, int *found) {
    double sum = 0;
    int any = 0;
    for (int i = 0; i < p->n; i++) {
        const kv_prom_sample *s = &p->samples[i];
        if (strcmp(s->name, name) || isnan(s->value)) continue;
        if (label) {
            const char *v = kv_prom_label_of(s, label);
            if (!v || strcmp(v, value)) continue;
        }
        sum += s->value;
        any = 1;
    }
    if (found) *found = any;
    return sum;
}

double kv_prom_sum(const kv_prom *p, const char *name, int *found) {
    return kv_prom_sum_where(p, name, NULL, NULL, found);
}

int kv_prom_has_prefix(const kv_prom *p, const char *prefix) {
    size_t n = strlen(prefix);
    for (int i = 0; i < p->n; i++)
        if (!strncmp(p->samples[i].name, prefix, n)) return 1;
    return 0;
}

/* ---- histograms ---- */

static int bucket_index(kv_hist *h, double le) {
    for (int i = 0; i < h->n; i++)
        if (h->le[i] == le) return i;
    if (h->n >= KV_HIST_MAX_BUCKETS) return -1;
    int i = h->n++;
    while (i > 0 && h->le[i - 1] > le) { /* keep le ascending */
        h->le[i] = h->le[i - 1];
        h->cum[i] = h->cum[i - 1];
        i--;
    }
    h->le[i] = le;
    h->cum[i] = 0;
    return i;
}

int kv_prom_histogram(const kv_prom *p, const char *base, kv_hist *out) {
    char bucket[200], count[200], sum[200];
    snprintf(bucket, sizeof bucket, "%s_bucket", base);
    snprintf(count, sizeof count, "%s_count", base);
    snprintf(sum, sizeof sum, "%s_sum", base);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < p->n; i++) {
        const kv_prom_sample *s = &p->samples[i];
        if (strcmp(s->name, bucket)) continue;
        const char *le = kv_prom_label_of(s, "le");
        double v;
        cursor c = {le, le ? le + strlen(le) : NULL};
        if (!le || read_value(&c, &v) || isnan(v) || isnan(s->value) || s->value < 0) return KV_ERR_FORMAT;
        int k = bucket_index(out, v);
        if (k < 0) return KV_ERR_FORMAT;
        out->cum[k] += s->value;
    }
    if (out->n == 0 || !isinf(out->le[out->n - 1])) return KV_ERR_FORMAT;
    for (int i = 1; i < out->n; i++)
        if (out->cum[i] < out->cum[i - 1]) return KV_ERR_FORMAT;
    int found;
    out->count = kv_prom_sum(p, count, &found);
    if (!found) out->count = out->cum[out->n - 1];
    out->sum = kv_prom_sum(p, sum, NULL);
    return 0;
}

void kv_hist_delta(const kv_hist *cur, const kv_hist *old, kv_hist *out) {
    int same = old && old->n == cur->n && old->count <= cur->count;
    for (int i = 0; same && i < cur->n; i++) same = old->le[i] == cur->le[i] && old->cum[i] <= cur->cum[i];
    *out = *cur;
    if (!same) return;
    for (int i = 0; i < cur->n; i++) out->cum[i] = cur->cum[i] - old->cum[i];
    out->count = cur->count - old->count;
    out->sum = cur->sum - old->sum;
}

double kv_hist_quantile(const kv_hist *h, double q) {
    if (h->n == 0 || q <= 0 || q >= 1) return NAN;
    double total = h->cum[h->n - 1];
    if (!(total > 0)) return NAN;
    double rank = q * total;
    int i = 0;
    while (i < h->n - 1 && h->cum[i] < rank) i++;
    if (isinf(h->le[i])) return h->n >= 2 ? h->le[h->n - 2] : NAN;
    double lo = i > 0 ? h->le[i - 1] : 0, below = i > 0 ? h->cum[i - 1] : 0;
    if (i == 0 && h->le[0] <= 0) return h->le[0];
    double in = h->cum[i] - below;
    if (in <= 0) return h->le[i];
    return lo + (h->le[i] - lo) * (rank - below) / in;
}

void kv_hist_window_init(kv_hist_window *w, double window_s) {
    memset(w, 0, sizeof *w);
    w->window_s = window_s;
}

void kv_hist_window_push(kv_hist_window *w, const kv_hist *h, double t_s) {
    int i = (w->head + w->n) % KV_HIST_WINDOW_CAP;
    if (w->n == KV_HIST_WINDOW_CAP) {
        w->head = (w->head + 1) % KV_HIST_WINDOW_CAP;
        i = (w->head + w->n - 1) % KV_HIST_WINDOW_CAP;
    } else {
        w->n++;
    }
    w->h[i] = *h;
    w->t[i] = t_s;
    /* drop scrapes older than the window, keeping one at or before its start */
    while (w->n > 2) {
        int second = (w->head + 1) % KV_HIST_WINDOW_CAP;
        if (t_s - w->t[second] < w->window_s) break;
        w->head = second;
        w->n--;
    }
}

void kv_hist_window_delta(const kv_hist_window *w, kv_hist *out) {
    memset(out, 0, sizeof *out);
    if (w->n < 2) return;
    const kv_hist *old = &w->h[w->head], *cur = &w->h[(w->head + w->n - 1) % KV_HIST_WINDOW_CAP];
    kv_hist_delta(cur, old, out);
}
