/* gguf_write.c - GGUF v3 writer: collects metadata and tensors (owned
 * copies, borrowed buffers or streaming fill callbacks) and streams them to
 * disk through a temporary file that replaces the target only when whole.
 * The reader is gguf.c.
 *
 * NOTE: a little-endian host is assumed (numbers are written with memcpy),
 * as in the reader. */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"
#include "gguf_internal.h"

#include "../base/cleanup.h"
#include "../base/vec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* Writer                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct wkv {
    char *key;      /* owned, NUL-terminated */
    uint32_t type;  /* kv_gguf_vtype */
    uint8_t *val;   /* owned encoded value (as in the file, after the type) */
    size_t nval;    /* bytes */
} wkv;

typedef struct wtensor {
    char *name;         /* owned */
    kv_type type;
    int n_dims;
    int64_t ne[KV_GGUF_MAX_DIMS];
    uint64_t size;      /* bytes */
    const void *data;   /* owned copy, borrowed ref, or NULL for fill */
    int owned;          /* 1 when data must be freed */
    kv_gguf_fill_fn fill; /* streaming producer (data == NULL) */
    void *fill_ctx;
    uint64_t offset;    /* from the data section start, set at write */
} wtensor;

struct kv_gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *ts;
    size_t n_t, cap_t;
    uint32_t alignment; /* bytes, power of two */
    int err_code;       /* first failed add (sticky), 0 if none */
    char err_msg[384];
};

kv_gguf_writer *kv_gguf_writer_new(void) {
    kv_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void kv_gguf_writer_free(kv_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->ts[i].name);
        if (w->ts[i].owned) free((void *)w->ts[i].data);
    }
    free(w->kvs);
    free(w->ts);
    free(w);
}

/* Records the first failure so that kv_gguf_writer_write reports it. */
static int w_fail(kv_gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int w_fail(kv_gguf_writer *w, int code, const char *fmt, ...) {
    if (w && !w->err_code) {
        w->err_code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err_msg, sizeof w->err_msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

static wkv *w_find_kv(kv_gguf_writer *w, const char *key) {
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kvs[i].key, key)) return &w->kvs[i];
    return NULL;
}

/* Adds an encoded value (copied). Checks first, commits second. */
static int w_add(kv_gguf_writer *w, const char *key, uint32_t type, const void *val, size_t nval) {
    if (!w) return KV_ERR_INVAL;
    char nm[96];
    if (!key || !*key) return w_fail(w, KV_ERR_INVAL, "gguf writer: empty key");
    kv_gguf_safe_name(key, strlen(key), nm);
    if (w_find_kv(w, key)) return w_fail(w, KV_ERR_INVAL, "gguf writer: duplicate key '%s'", nm);
    if (!strcmp(key, "general.alignment")) {
        uint32_t a;
        if (type != KV_GGUF_UINT32 || nval != 4)
            return w_fail(w, KV_ERR_INVAL, "gguf writer: general.alignment must be a uint32");
        memcpy(&a, val, 4);
        if (a == 0 || (a & (a - 1)))
            return w_fail(w, KV_ERR_INVAL, "gguf writer: general.alignment %u is not a power of two", a);
    }
    if (kv_grow_size((void **)&w->kvs, &w->cap_kv, w->n_kv + 1, sizeof *w->kvs))
        return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
    char *k = strdup(key);
    uint8_t *v = malloc(nval ? nval : 1);
    if (!k || !v) {
        free(k);
        free(v);
        return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory for key '%s'", nm);
    }
    if (nval) memcpy(v, val, nval);
    w->kvs[w->n_kv++] = (wkv){k, type, v, nval};
    if (!strcmp(key, "general.alignment")) memcpy(&w->alignment, val, 4);
    return 0;
}

int kv_gguf_writer_set_alignment(kv_gguf_writer *w, uint32_t alignment) {
    if (!w) return KV_ERR_INVAL;
    if (alignment == 0 || (alignment & (alignment - 1)))
        return w_fail(w, KV_ERR_INVAL, "gguf writer: alignment %u is not a power of two", alignment);
    wkv *kv = w_find_kv(w, "general.alignment");
    if (kv) {
        memcpy(kv->val, &alignment, 4);
        w->alignment = alignment;
        return 0;
    }
    if (alignment == GGUF_DEFAULT_ALIGNMENT) {
        w->alignment = alignment;
        return 0;
    }
    return w_add(w, "general.alignment", KV_GGUF_UINT32, &alignment, 4);
}

int kv_gguf_writer_add_scalar(kv_gguf_writer *w, const char *key, kv_gguf_vtype type, const void *v) {
    size_t fs = kv_gguf_vtype_fixed_size(type);
    if (!fs || !v) return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': %s is not a scalar type", key ? key : "",
                                 kv_gguf_vtype_name(type));
    if (type == KV_GGUF_BOOL && *(const uint8_t *)v > 1)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': bool must be 0 or 1", key ? key : "");
    return w_add(w, key, type, v, fs);
}

int kv_gguf_writer_add_u32(kv_gguf_writer *w, const char *key, uint32_t v) {
    return w_add(w, key, KV_GGUF_UINT32, &v, 4);
}
int kv_gguf_writer_add_i32(kv_gguf_writer *w, const char *key, int32_t v) {
    return w_add(w, key, KV_GGUF_INT32, &v, 4);
}
int kv_gguf_writer_add_u64(kv_gguf_writer *w, const char *key, uint64_t v) {
    return w_add(w, key, KV_GGUF_UINT64, &v, 8);
}
int kv_gguf_writer_add_f32(kv_gguf_writer *w, const char *key, float v) {
    return w_add(w, key, KV_GGUF_FLOAT32, &v, 4);
}
int kv_gguf_writer_add_bool(kv_gguf_writer *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    return w_add(w, key, KV_GGUF_BOOL, &b, 1);
}

int kv_gguf_writer_add_str(kv_gguf_writer *w, const char *key, const char *v) {
    if (!v) return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': NULL string", key ? key : "");
    size_t n = strlen(v);
    uint8_t *enc = malloc(8 + n);
    if (!enc) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
    uint64_t len = n;
    memcpy(enc, &len, 8);
    memcpy(enc + 8, v, n);
    int rc = w_add(w, key, KV_GGUF_STRING, enc, 8 + n);
    free(enc);
    return rc;
}

int kv_gguf_writer_add_arr(kv_gguf_writer *w, const char *key, kv_gguf_vtype elem_type, const void *data,
                           uint64_t n) {
    const char *k = key ? key : "";
    size_t fs = kv_gguf_vtype_fixed_size(elem_type);
    if (!fs)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': %s is not a numeric element type", k,
                      kv_gguf_vtype_name(elem_type));
    uint64_t bytes, total;
    if (kv_mul_overflow(n, fs, &bytes) || kv_add_overflow(bytes, 12, &total) || total > SIZE_MAX / 2)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': array of %llu elements is too large", k,
                      (unsigned long long)n);
    if (n && !data) return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': NULL array data", k);
    if (elem_type == KV_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': bool element %llu is not 0 or 1", k,
                              (unsigned long long)i);
    uint8_t *enc = malloc((size_t)total);
    if (!enc) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory for key '%s'", k);
    uint32_t et = elem_type;
    memcpy(enc, &et, 4);
    memcpy(enc + 4, &n, 8);
    if (bytes) memcpy(enc + 12, data, (size_t)bytes);
    int rc = w_add(w, key, KV_GGUF_ARRAY, enc, (size_t)total);
    free(enc);
    return rc;
}

int kv_gguf_writer_add_arr_str(kv_gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                               uint64_t n) {
    const char *k = key ? key : "";
    if (n && !strs) return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': NULL string array", k);
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': string %llu is NULL", k,
                                    (unsigned long long)i);
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        if (kv_add_overflow(total, 8, &total) || kv_add_overflow(total, len, &total) || total > SIZE_MAX / 2)
            return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': string array too large", k);
    }
    uint8_t *enc = malloc((size_t)total);
    if (!enc) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory for key '%s'", k);
    uint32_t et = KV_GGUF_STRING;
    memcpy(enc, &et, 4);
    memcpy(enc + 4, &n, 8);
    size_t o = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = lens ? lens[i] : strlen(strs[i]);
        memcpy(enc + o, &len, 8);
        memcpy(enc + o + 8, strs[i], (size_t)len);
        o += 8 + (size_t)len;
    }
    int rc = w_add(w, key, KV_GGUF_ARRAY, enc, (size_t)total);
    free(enc);
    return rc;
}

int kv_gguf_writer_add_raw(kv_gguf_writer *w, const char *key, kv_gguf_vtype type, const void *value,
                           size_t nbytes) {
    kv_err e;
    char what[128], nm[96];
    const char *k = key ? key : "";
    snprintf(what, sizeof what, "key '%s'", kv_gguf_safe_name(k, strlen(k), nm));
    size_t used = 0;
    if (kv_gguf_validate_value((uint32_t)type, value ? value : (const void *)"", value ? nbytes : 0, what,
                               &used, &e))
        return w_fail(w, KV_ERR_INVAL, "%s", e.msg);
    if (used != nbytes)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': %zu trailing bytes after the %s value", nm,
                      nbytes - used, kv_gguf_vtype_name(type));
    return w_add(w, key, type, value, nbytes);
}

int kv_gguf_writer_copy_kv(kv_gguf_writer *w, const kv_gguf *g, int (*skip)(const char *key, void *ctx),
                           void *ctx) {
    if (!w || !g) return w_fail(w, KV_ERR_INVAL, "gguf writer: copy_kv from NULL");
    char *key = NULL;
    int rc = 0;
    for (int64_t i = 0; i < kv_gguf_n_kv(g) && !rc; i++) {
        kv_gguf_str kname = kv_gguf_key_at(g, i);
        char *nk = realloc(key, (size_t)kname.len + 1);
        if (!nk) {
            rc = w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
            break;
        }
        key = nk;
        memcpy(key, kname.data, (size_t)kname.len);
        key[kname.len] = '\0';
        if (skip && skip(key, ctx)) continue;
        if (!strcmp(key, "general.alignment")) {
            rc = kv_gguf_writer_set_alignment(w, (uint32_t)kv_gguf_alignment(g));
            continue;
        }
        rc = w_add(w, key, g->kvs[i].type, g->buf + g->kvs[i].val_pos, g->kvs[i].val_size);
    }
    free(key);
    return rc;
}

/* Validates a tensor description and fills t (without data). */
static int w_tensor_check(kv_gguf_writer *w, wtensor *t, const char *name, kv_type type, int n_dims,
                          const int64_t *ne) {
    char nm[96];
    if (!w) return KV_ERR_INVAL;
    if (!name || !*name) return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor with an empty name");
    kv_gguf_safe_name(name, strlen(name), nm);
    /* 64 bytes is GGML_MAX_NAME including the NUL: longer names do not load in llama.cpp */
    if (strlen(name) >= 64) return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor name '%s' is 64 bytes or longer", nm);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->ts[i].name, name)) return w_fail(w, KV_ERR_INVAL, "gguf writer: duplicate tensor '%s'", nm);
    const kv_type_traits *tr = kv_type_get((int)type);
    if (!tr) return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': unknown type id %d", nm, (int)type);
    if (n_dims < 1 || n_dims > KV_GGUF_MAX_DIMS || !ne)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': n_dims %d (must be 1..%d)", nm, n_dims,
                      KV_GGUF_MAX_DIMS);
    memset(t, 0, sizeof *t);
    uint64_t nel = 1;
    for (int d = 0; d < KV_GGUF_MAX_DIMS; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (t->ne[d] < 1)
            return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': ne[%d] = %lld (must be >= 1)", nm, d,
                          (long long)t->ne[d]);
        if (kv_mul_overflow(nel, (uint64_t)t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': element count overflows", nm);
    }
    if (t->ne[0] % tr->blck_size)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d",
                      nm, (long long)t->ne[0], tr->name, tr->blck_size);
    if (kv_mul_overflow(nel / (uint64_t)tr->blck_size, tr->type_size, &t->size))
        return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': byte size overflows", nm);
    t->type = type;
    t->n_dims = n_dims;
    return 0;
}

static int w_tensor_commit(kv_gguf_writer *w, wtensor *t, const char *name) {
    if (kv_grow_size((void **)&w->ts, &w->cap_t, w->n_t + 1, sizeof *w->ts))
        return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
    t->name = strdup(name);
    if (!t->name) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
    w->ts[w->n_t++] = *t;
    return 0;
}

static int w_add_tensor(kv_gguf_writer *w, const char *name, kv_type type, int n_dims, const int64_t *ne,
                        const void *data, uint64_t size, int copy) {
    wtensor t;
    int rc = w_tensor_check(w, &t, name, type, n_dims, ne);
    if (rc) return rc;
    char nm[96];
    kv_gguf_safe_name(name, strlen(name), nm);
    if (size != t.size)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': %llu data bytes given, shape and type need %llu",
                      nm, (unsigned long long)size, (unsigned long long)t.size);
    if (!data) return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': NULL data", nm);
    if (copy) {
        if (size > SIZE_MAX / 2) return w_fail(w, KV_ERR_NOMEM, "gguf writer: tensor '%s' too large", nm);
        void *d = malloc((size_t)size);
        if (!d) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", nm);
        memcpy(d, data, (size_t)size);
        t.data = d;
        t.owned = 1;
    } else {
        t.data = data;
    }
    rc = w_tensor_commit(w, &t, name);
    if (rc && t.owned) free((void *)t.data);
    return rc;
}

int kv_gguf_writer_add_tensor(kv_gguf_writer *w, const char *name, kv_type type, int n_dims, const int64_t *ne,
                              const void *data, uint64_t size) {
    return w_add_tensor(w, name, type, n_dims, ne, data, size, 1);
}

int kv_gguf_writer_add_tensor_ref(kv_gguf_writer *w, const char *name, kv_type type, int n_dims,
                                  const int64_t *ne, const void *data, uint64_t size) {
    return w_add_tensor(w, name, type, n_dims, ne, data, size, 0);
}

int kv_gguf_writer_add_tensor_fn(kv_gguf_writer *w, const char *name, kv_type type, int n_dims, const int64_t *ne,
                                 kv_gguf_fill_fn fill, void *ctx) {
    wtensor t;
    int rc = w_tensor_check(w, &t, name, type, n_dims, ne);
    if (rc) return rc;
    if (!fill) return w_fail(w, KV_ERR_INVAL, "gguf writer: tensor '%s': NULL fill function", name);
    t.fill = fill;
    t.fill_ctx = ctx;
    return w_tensor_commit(w, &t, name);
}

/* Output with error tracking: the first failure sticks. */
typedef struct wout {
    FILE *f;
    uint64_t pos; /* bytes written */
    int failed;   /* errno of the first failed write, 0 if none */
} wout;

static void out_put(wout *o, const void *p, size_t n) {
    if (o->failed || n == 0) return;
    if (fwrite(p, 1, n, o->f) != n) o->failed = errno ? errno : EIO;
    o->pos += n;
}
static void out_u32(wout *o, uint32_t v) { out_put(o, &v, 4); }
static void out_u64(wout *o, uint64_t v) { out_put(o, &v, 8); }
static void out_pad(wout *o, uint64_t a) {
    static const uint8_t zeros[256];
    while (o->pos & (a - 1)) {
        uint64_t need = a - (o->pos & (a - 1));
        out_put(o, zeros, need < sizeof zeros ? (size_t)need : sizeof zeros);
        if (o->failed) return;
    }
}

/* Streams a fill tensor through a reusable row buffer. */
static int out_fill(wout *o, wtensor *t, uint8_t **buf, size_t *cap, kv_err *err, const char *path) {
    uint64_t row = t->size / (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    int64_t nrows = t->ne[1] * t->ne[2] * t->ne[3];
    /* about 1 MiB of rows per call, at least one row */
    int64_t per = (int64_t)((1u << 20) / (row ? row : 1));
    if (per < 1) per = 1;
    if (per > nrows) per = nrows;
    size_t need = (size_t)(row * (uint64_t)per);
    if (need > *cap) {
        uint8_t *nb = realloc(*buf, need);
        if (!nb) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory streaming tensor '%s'", path, t->name);
        *buf = nb;
        *cap = need;
    }
    for (int64_t r = 0; r < nrows; r += per) {
        int64_t k = nrows - r < per ? nrows - r : per;
        int rc = t->fill(t->fill_ctx, *buf, r, k);
        if (rc)
            return kv_err_set(err, rc < 0 ? rc : KV_ERR_INVAL, "%s: producing tensor '%s' rows %lld..%lld failed",
                              path, t->name, (long long)r, (long long)(r + k));
        out_put(o, *buf, (size_t)(row * (uint64_t)k));
        if (o->failed) return 0;
    }
    return 0;
}

int kv_gguf_writer_write(kv_gguf_writer *w, const char *path, kv_err *err) {
    if (!w || !path || !*path) return kv_err_set(err, KV_ERR_INVAL, "gguf writer: NULL writer or path");
    if (w->err_code) return kv_err_set(err, w->err_code, "%s: %s", path, w->err_msg);
    uint64_t a = w->alignment;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        off = (off + a - 1) & ~(a - 1);
        w->ts[i].offset = off;
        if (kv_add_overflow(off, w->ts[i].size, &off))
            return kv_err_set(err, KV_ERR_INVAL, "%s: tensor data exceeds 2^64 bytes", path);
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int e = errno;
        kv_err_set(err, KV_ERR_IO, "%s: cannot create: %s", tmp, strerror(e));
        free(tmp);
        return KV_ERR_IO;
    }
    kv_cleanup_add(tmp); /* removed if a signal ends the process mid-write */
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    wout o = {f, 0, 0};
    int rc = 0;
    uint8_t *fbuf = NULL;
    size_t fcap = 0;

    out_put(&o, GGUF_MAGIC, 4);
    out_u32(&o, 3);
    out_u64(&o, (uint64_t)w->n_t);
    out_u64(&o, (uint64_t)w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kvs[i];
        size_t kl = strlen(kv->key);
        out_u64(&o, kl);
        out_put(&o, kv->key, kl);
        out_u32(&o, kv->type);
        out_put(&o, kv->val, kv->nval);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->ts[i];
        size_t nl = strlen(t->name);
        out_u64(&o, nl);
        out_put(&o, t->name, nl);
        out_u32(&o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) out_u64(&o, (uint64_t)t->ne[d]);
        out_u32(&o, (uint32_t)t->type);
        out_u64(&o, t->offset);
    }
    out_pad(&o, a);
    uint64_t data_start = o.pos;
    for (size_t i = 0; i < w->n_t && !rc && !o.failed; i++) {
        wtensor *t = &w->ts[i];
        out_pad(&o, a);
        if (!o.failed && o.pos - data_start != t->offset) o.failed = EIO; /* cannot happen: layout above */
        if (t->fill) rc = out_fill(&o, t, &fbuf, &fcap, err, path);
        else out_put(&o, t->data, (size_t)t->size);
    }
    if (!rc) out_pad(&o, a);
    free(fbuf);
    int e = rc ? 0 : o.failed;
    if (fclose(f) != 0 && !rc && !e) e = errno ? errno : EIO;
    if (!rc && e) rc = kv_err_set(err, KV_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    if (!rc && rename(tmp, path) != 0)
        rc = kv_err_set(err, KV_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    kv_cleanup_remove(tmp);
    free(tmp);
    return rc;
}
