/* gguf_meta.c - typed reads of GGUF metadata (integers widened or
 * range-checked, floats, bools, strings, arrays) and the one-line text form
 * `kvtop info` prints for each value. The file was validated whole when it
 * was opened (gguf.c), so reads here only check types and ranges. */
#include "gguf.h"
#include "gguf_internal.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const gg_kv *find_kv(const kv_gguf *g, const char *key) {
    int64_t i = kv_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* An integer value as sign/magnitude: neg says which of u/s holds it. */
typedef struct gg_int {
    int neg;
    uint64_t u;
    int64_t s;
} gg_int;

/* Integer getter core: reads an integer-typed value into *v (OUT). */
static int get_int(const kv_gguf *g, const char *key, gg_int *v, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (!kv_gguf_vtype_is_int(kv->type))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not an integer (byte %zu)", g->name, key,
                          kv_gguf_vtype_name(kv->type), kv->val_pos);
    kv_gguf_read_int(g->buf + kv->val_pos, kv->type, &v->neg, &v->u, &v->s);
    return 0;
}

int kv_gguf_get_u64(const kv_gguf *g, const char *key, uint64_t *out, kv_err *err) {
    gg_int v;
    int rc = get_int(g, key, &v, err);
    if (rc) return rc;
    if (v.neg)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %lld is negative", g->name, key, (long long)v.s);
    *out = v.u;
    return 0;
}

int kv_gguf_get_i64(const kv_gguf *g, const char *key, int64_t *out, kv_err *err) {
    gg_int v;
    int rc = get_int(g, key, &v, err);
    if (rc) return rc;
    if (!v.neg && v.u > (uint64_t)INT64_MAX)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %llu does not fit int64", g->name, key,
                          (unsigned long long)v.u);
    *out = v.s;
    return 0;
}

int kv_gguf_get_u32(const kv_gguf *g, const char *key, uint32_t *out, kv_err *err) {
    gg_int v;
    int rc = get_int(g, key, &v, err);
    if (rc) return rc;
    if (v.neg)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %lld does not fit uint32", g->name, key,
                          (long long)v.s);
    if (v.u > UINT32_MAX)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %llu does not fit uint32", g->name, key,
                          (unsigned long long)v.u);
    *out = (uint32_t)v.u;
    return 0;
}

int kv_gguf_get_f32(const kv_gguf *g, const char *key, float *out, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type == KV_GGUF_FLOAT32) {
        memcpy(out, g->buf + kv->val_pos, 4);
        return 0;
    }
    if (kv->type == KV_GGUF_FLOAT64) {
        double d;
        memcpy(&d, g->buf + kv->val_pos, 8);
        if (d == d && (d > FLT_MAX || d < -FLT_MAX) && d - d == 0) /* finite but too big for float */
            return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %g does not fit float32", g->name, key, d);
        *out = (float)d;
        return 0;
    }
    return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not a float (byte %zu)", g->name, key,
                      kv_gguf_vtype_name(kv->type), kv->val_pos);
}

int kv_gguf_get_bool(const kv_gguf *g, const char *key, int *out, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != KV_GGUF_BOOL)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not a bool (byte %zu)", g->name, key,
                          kv_gguf_vtype_name(kv->type), kv->val_pos);
    *out = g->buf[kv->val_pos] != 0;
    return 0;
}

int kv_gguf_get_str(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != KV_GGUF_STRING)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not a string (byte %zu)", g->name, key,
                          kv_gguf_vtype_name(kv->type), kv->val_pos);
    uint64_t len;
    memcpy(&len, g->buf + kv->val_pos, 8);
    out->len = len;
    out->data = (const char *)g->buf + kv->val_pos + 8;
    return 0;
}

int kv_gguf_get_arr(const kv_gguf *g, const char *key, kv_gguf_vtype *elem_type, uint64_t *n, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != KV_GGUF_ARRAY)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not an array (byte %zu)", g->name, key,
                          kv_gguf_vtype_name(kv->type), kv->val_pos);
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->n;
    return 0;
}

kv_gguf_str kv_gguf_arr_str(const kv_gguf *g, const char *key, uint64_t i) {
    kv_gguf_str s = {0, NULL};
    const gg_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KV_GGUF_ARRAY || kv->elem_type != KV_GGUF_STRING || i >= kv->n) return s;
    size_t p = kv->str_pos[i];
    memcpy(&s.len, g->buf + p, 8);
    s.data = (const char *)g->buf + p + 8;
    return s;
}

static const gg_kv *numeric_arr(const kv_gguf *g, const char *key) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KV_GGUF_ARRAY || !kv_gguf_vtype_fixed_size(kv->elem_type)) return NULL;
    return kv;
}

const void *kv_gguf_arr_data(const kv_gguf *g, const char *key) {
    const gg_kv *kv = numeric_arr(g, key);
    return kv ? g->buf + kv->arr_pos : NULL;
}

/* Element i of a fixed-size array as double (and, exactly, as int64). */
static int arr_elem(const kv_gguf *g, const gg_kv *kv, uint64_t i, double *d, int64_t *iv, int *iv_ok) {
    if (!kv || i >= kv->n) return -1;
    const uint8_t *p = g->buf + kv->arr_pos + i * kv_gguf_vtype_fixed_size(kv->elem_type);
    *iv_ok = 1;
    if (kv->elem_type == KV_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *d = f;
        *iv_ok = 0;
    } else if (kv->elem_type == KV_GGUF_FLOAT64) {
        memcpy(d, p, 8);
        *iv_ok = 0;
    } else if (kv->elem_type == KV_GGUF_BOOL) {
        *iv = p[0];
        *d = p[0];
    } else {
        int neg;
        uint64_t u;
        int64_t s;
        kv_gguf_read_int(p, kv->elem_type, &neg, &u, &s);
        *d = neg ? (double)s : (double)u;
        *iv = s;
        if (!neg && u > (uint64_t)INT64_MAX) *iv_ok = 0;
    }
    return 0;
}

double kv_gguf_arr_f64(const kv_gguf *g, const char *key, uint64_t i) {
    double d;
    int64_t iv;
    int ok;
    if (arr_elem(g, numeric_arr(g, key), i, &d, &iv, &ok)) return 0;
    return d;
}

int64_t kv_gguf_arr_i64(const kv_gguf *g, const char *key, uint64_t i) {
    double d;
    int64_t iv;
    int ok;
    if (arr_elem(g, numeric_arr(g, key), i, &d, &iv, &ok)) return 0;
    if (ok) return iv;
    /* floats truncate toward zero when they fit; NaN and out-of-range give 0 */
    if (d == d && d > -9.2233720368547758e18 && d < 9.2233720368547758e18) return (int64_t)d;
    return 0;
}

/* --- formatting --------------------------------------------------------- */

/* Bounded string builder: never writes past cap, remembers truncation. */
typedef struct sbuf {
    char *buf;
    size_t cap, len;
    int full;
} sbuf;

static void sb_putn(sbuf *s, const char *p, size_t n) {
    if (s->full) return;
    size_t room = s->cap - 1 - s->len;
    if (n > room) {
        n = room;
        s->full = 1;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = '\0';
}
static void sb_puts(sbuf *s, const char *p) { sb_putn(s, p, strlen(p)); }
static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    char tmp[80];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_putn(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_quoted(sbuf *s, const char *p, uint64_t len) {
    sb_putn(s, "\"", 1);
    for (uint64_t i = 0; i < len && !s->full; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            sb_putn(s, e, 2);
        } else if (ch == '\n') {
            sb_puts(s, "\\n");
        } else if (ch == '\t') {
            sb_puts(s, "\\t");
        } else if (ch == '\r') {
            sb_puts(s, "\\r");
        } else if (ch < 0x20 || ch == 0x7f) {
            sb_printf(s, "\\x%02x", ch);
        } else {
            sb_putn(s, (const char *)&ch, 1); /* UTF-8 bytes pass through */
        }
    }
    sb_putn(s, "\"", 1);
}

/* Formats the value of type t at the cursor (already validated) and
 * advances past it; stops early once the builder is full. */
static void fmt_value(sbuf *s, cursor *c, uint32_t t, int nested);

static void fmt_array(sbuf *s, cursor *c, int nested) {
    uint32_t et;
    uint64_t n;
    if (cur_u32(c, &et) || cur_u64(c, &n)) return;
    sb_printf(s, nested ? "[%s x %llu: " : "[%s x %llu] ", kv_gguf_vtype_name((kv_gguf_vtype)et),
              (unsigned long long)n);
    for (uint64_t i = 0; i < n && !s->full; i++) {
        if (i) sb_puts(s, ", ");
        fmt_value(s, c, et, 1);
    }
    if (nested) sb_puts(s, "]");
}

static void fmt_value(sbuf *s, cursor *c, uint32_t t, int nested) {
    size_t fs = kv_gguf_vtype_fixed_size(t);
    if (fs) {
        if (cur_left(c) < fs) return;
        const uint8_t *p = c->b + c->pos;
        c->pos += fs;
        if (t == KV_GGUF_FLOAT32) {
            float f;
            memcpy(&f, p, 4);
            sb_printf(s, "%.9g", f);
        } else if (t == KV_GGUF_FLOAT64) {
            double d;
            memcpy(&d, p, 8);
            sb_printf(s, "%.17g", d);
        } else if (t == KV_GGUF_BOOL) {
            sb_puts(s, p[0] ? "true" : "false");
        } else {
            int neg;
            uint64_t u;
            int64_t v;
            kv_gguf_read_int(p, t, &neg, &u, &v);
            if (neg) sb_printf(s, "%lld", (long long)v);
            else sb_printf(s, "%llu", (unsigned long long)u);
        }
    } else if (t == KV_GGUF_STRING) {
        uint64_t len;
        if (cur_u64(c, &len) || len > cur_left(c)) return;
        sb_quoted(s, (const char *)c->b + c->pos, len);
        c->pos += (size_t)len;
    } else if (t == KV_GGUF_ARRAY) {
        fmt_array(s, c, nested);
    }
}

void kv_gguf_format_value(const kv_gguf *g, int64_t i, char *buf, size_t cap) {
    if (!buf || cap == 0) return;
    buf[0] = '\0';
    if (!g || i < 0 || i >= g->n_kv) return;
    const gg_kv *kv = &g->kvs[i];
    sbuf s = {buf, cap, 0, 0};
    cursor c = {g->buf, kv->val_pos + kv->val_size, kv->val_pos};
    fmt_value(&s, &c, kv->type, 0);
    /* more elements than shown: say so even when the buffer did not fill */
    if (kv->type == KV_GGUF_ARRAY && !s.full && c.pos < kv->val_pos + kv->val_size) s.full = 1;
    if (s.full && cap >= 4) memcpy(buf + (s.len + 3 < cap ? s.len : cap - 4), "...", 4);
}
