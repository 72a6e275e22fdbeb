/* gguf.c - GGUF v2/v3 reader (mmap or caller buffer) and v3 writer.
 * The reader validates the whole file once at open time (every count, length
 * and offset against the bytes that remain) and then serves borrowed views
 * into the buffer; the writer collects entries and streams them to disk.
 *
 * NOTE: a little-endian host is assumed throughout: numbers are copied out of
 * the file with memcpy and never byte-swapped (GGUF is little-endian; a
 * big-endian file is recognised by its version field and rejected). */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include "../base/cleanup.h"
#include "../base/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host (see the NOTE above)"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */
/* Arrays of arrays deeper than this are rejected: no real file nests at all
 * beyond one level, and the bound keeps validation recursion shallow. */
#define GGUF_MAX_DEPTH 16
/* The smallest possible encodings, used to bound counts by the bytes left
 * before anything is allocated. */
#define GGUF_MIN_KV_BYTES 13     /* key len (8) + 1 key byte + type (4) + ... */
#define GGUF_MIN_TENSOR_BYTES 33 /* name len (8) + 1 + n_dims (4) + ne (8) + type (4) + offset (8) */
#define GGUF_MIN_STR_BYTES 8     /* length field */
#define GGUF_MIN_ARR_BYTES 12    /* element type (4) + count (8) */

/* ---------------------------------------------------------------------- */
/* Shared helpers                                                          */
/* ---------------------------------------------------------------------- */

static const char *const vtype_names[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                          "bool", "string", "array", "u64", "i64", "f64"};

const char *kv_gguf_vtype_name(kv_gguf_vtype t) {
    if ((unsigned)t < KV_ARRAY_LEN(vtype_names)) return vtype_names[t];
    return "unknown";
}

/* Bytes of one element of a fixed-size type, 0 for string/array/unknown. */
static size_t vtype_fixed_size(uint32_t t) {
    switch (t) {
    case KV_GGUF_UINT8:
    case KV_GGUF_INT8:
    case KV_GGUF_BOOL: return 1;
    case KV_GGUF_UINT16:
    case KV_GGUF_INT16: return 2;
    case KV_GGUF_UINT32:
    case KV_GGUF_INT32:
    case KV_GGUF_FLOAT32: return 4;
    case KV_GGUF_UINT64:
    case KV_GGUF_INT64:
    case KV_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static int vtype_valid(uint32_t t) { return t <= KV_GGUF_FLOAT64; }
static int vtype_is_int(uint32_t t) {
    return t == KV_GGUF_UINT8 || t == KV_GGUF_INT8 || t == KV_GGUF_UINT16 || t == KV_GGUF_INT16 ||
           t == KV_GGUF_UINT32 || t == KV_GGUF_INT32 || t == KV_GGUF_UINT64 || t == KV_GGUF_INT64;
}

/* Reads one fixed-size integer element as a signed/unsigned pair: *neg set
 * when the value is negative, *mag its magnitude as stored (two's
 * complement value for negatives). */
static void read_int(const uint8_t *p, uint32_t t, int *neg, uint64_t *u, int64_t *s) {
    *neg = 0;
    switch (t) {
    case KV_GGUF_UINT8: *u = p[0]; break;
    case KV_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *u = v; } break;
    case KV_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *u = v; } break;
    case KV_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); *u = v; } break;
    case KV_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); *s = v; *neg = v < 0; } goto sgn;
    case KV_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *s = v; *neg = v < 0; } goto sgn;
    case KV_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *s = v; *neg = v < 0; } goto sgn;
    case KV_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *s = v; *neg = v < 0; } goto sgn;
    default: *u = 0; break;
    }
    *s = *u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)*u;
    return;
sgn:
    *u = *neg ? 0 : (uint64_t)*s;
}

/* Prints a possibly-binary name for an error message: printable ASCII kept,
 * everything else as \xNN, cut at about 64 bytes. */
static const char *safe_name(const char *p, uint64_t len, char out[96]) {
    size_t o = 0;
    for (uint64_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (o + 8 >= 96 - 4 || i >= 64) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (ch >= 0x20 && ch < 0x7f) {
            out[o++] = (char)ch;
        } else {
            snprintf(out + o, 5, "\\x%02x", ch);
            o += 4;
        }
    }
    out[o] = '\0';
    return out;
}

/* Bounded cursor over the input; invariant pos <= size. */
typedef struct cursor {
    const uint8_t *b;
    size_t size;
    size_t pos;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }
static int cur_u32(cursor *c, uint32_t *v) {
    if (cur_left(c) < 4) return -1;
    memcpy(v, c->b + c->pos, 4);
    c->pos += 4;
    return 0;
}
static int cur_u64(cursor *c, uint64_t *v) {
    if (cur_left(c) < 8) return -1;
    memcpy(v, c->b + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* Context of a validation pass: where to report, and which key or tensor
 * is being read so the message can name it. */
typedef struct pctx {
    const char *fname;
    kv_err *err;
    const char *what; /* "key 'x'" or "tensor 'y'" or "header" */
} pctx;

/* Reads a string (length + bytes) and returns its view. */
static int parse_str(pctx *p, cursor *c, kv_gguf_str *out, const char *role) {
    size_t at = c->pos;
    uint64_t len;
    if (cur_u64(c, &len))
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: %s length truncated at byte %zu (file ends at %zu)",
                          p->fname, p->what, role, at, c->size);
    if (len > cur_left(c))
        return kv_err_set(p->err, KV_ERR_FORMAT,
                          "%s: %s: %s of %llu bytes at byte %zu runs past the end (%zu bytes left)", p->fname,
                          p->what, role, (unsigned long long)len, at, cur_left(c));
    if (out) {
        out->len = len;
        out->data = (const char *)c->b + c->pos;
    }
    c->pos += (size_t)len;
    return 0;
}

/* Validates the n elements of an array body of type et starting at the
 * cursor. str_pos, when not NULL, receives the position of each string
 * element's length field (caller sized it to n). */
static int parse_array_body(pctx *p, cursor *c, uint32_t et, uint64_t n, int depth, size_t *str_pos);

/* Validates one value of type t at the cursor and advances past it. */
static int parse_value(pctx *p, cursor *c, uint32_t t, int depth) {
    size_t at = c->pos;
    if (!vtype_valid(t))
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: unknown value type %u at byte %zu", p->fname, p->what,
                          t, at);
    size_t fs = vtype_fixed_size(t);
    if (fs) {
        if (cur_left(c) < fs)
            return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: %s value truncated at byte %zu (file ends at %zu)",
                              p->fname, p->what, vtype_names[t], at, c->size);
        if (t == KV_GGUF_BOOL && c->b[c->pos] > 1)
            return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: bool value %u at byte %zu (must be 0 or 1)",
                              p->fname, p->what, c->b[c->pos], at);
        c->pos += fs;
        return 0;
    }
    if (t == KV_GGUF_STRING) return parse_str(p, c, NULL, "string");
    /* array */
    if (depth >= GGUF_MAX_DEPTH)
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: arrays nested deeper than %d at byte %zu", p->fname,
                          p->what, GGUF_MAX_DEPTH, at);
    uint32_t et;
    uint64_t n;
    if (cur_u32(c, &et) || cur_u64(c, &n))
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: array header truncated at byte %zu (file ends at %zu)",
                          p->fname, p->what, at, c->size);
    return parse_array_body(p, c, et, n, depth + 1, NULL);
}

static int parse_array_body(pctx *p, cursor *c, uint32_t et, uint64_t n, int depth, size_t *str_pos) {
    size_t at = c->pos;
    if (!vtype_valid(et))
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s: array of unknown element type %u at byte %zu", p->fname,
                          p->what, et, at);
    size_t fs = vtype_fixed_size(et);
    size_t min = fs ? fs : et == KV_GGUF_STRING ? GGUF_MIN_STR_BYTES : GGUF_MIN_ARR_BYTES;
    if (n > cur_left(c) / min)
        return kv_err_set(p->err, KV_ERR_FORMAT,
                          "%s: %s: array of %llu %s elements at byte %zu cannot fit in the %zu bytes left",
                          p->fname, p->what, (unsigned long long)n, vtype_names[et], at, cur_left(c));
    if (fs) {
        if (et == KV_GGUF_BOOL) {
            for (uint64_t i = 0; i < n; i++)
                if (c->b[c->pos + i] > 1)
                    return kv_err_set(p->err, KV_ERR_FORMAT,
                                      "%s: %s: bool element %llu is %u at byte %zu (must be 0 or 1)", p->fname,
                                      p->what, (unsigned long long)i, c->b[c->pos + i], c->pos + (size_t)i);
        }
        c->pos += (size_t)n * fs; /* n * fs <= left: checked above */
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (str_pos) str_pos[i] = c->pos;
        int rc = parse_value(p, c, et, depth);
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Reader                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct gg_kv {
    kv_gguf_str key;        /* borrowed from the buffer */
    kv_gguf_vtype type;
    size_t val_pos;         /* byte offset of the value (after the type field) */
    size_t val_size;        /* bytes of the encoded value */
    kv_gguf_vtype elem_type; /* arrays only */
    uint64_t n;             /* arrays only: element count */
    size_t arr_pos;         /* arrays only: byte offset of the first element */
    size_t *str_pos;        /* string arrays only: n byte offsets of each element's length field */
} gg_kv;

struct kv_gguf {
    const uint8_t *buf;     /* whole file (mapped or caller's) */
    size_t size;            /* bytes */
    int mapped;             /* 1 when buf is our mmap */
    char name[256];         /* file name for messages ("<memory>" for buffers) */
    uint32_t version;
    uint64_t alignment;     /* bytes, power of two */
    size_t data_offset;     /* start of the tensor data section */
    int64_t n_kv;
    gg_kv *kvs;             /* n_kv, file order */
    int64_t n_tensors;
    kv_gguf_tensor *tensors; /* n_tensors, file order */
    size_t *t_info_pos;     /* n_tensors: byte offset of each tensor info, for messages */
    int64_t *kv_hash;       /* open addressing over kvs by key, -1 empty; kv_hash_cap slots */
    size_t kv_hash_cap;
    int64_t *t_hash;        /* same over tensors by name */
    size_t t_hash_cap;
};

static size_t hash_cap_for(int64_t n) {
    size_t cap = 8;
    while (cap < (size_t)n * 2) cap <<= 1;
    return cap;
}

/* Looks name up in a table whose entries are named by get(i). Returns the
 * slot holding it, or the empty slot where it would go (*found says). */
typedef kv_gguf_str (*name_of_fn)(const kv_gguf *g, int64_t i);
static kv_gguf_str kv_name_of(const kv_gguf *g, int64_t i) { return g->kvs[i].key; }
static kv_gguf_str t_name_of(const kv_gguf *g, int64_t i) { return g->tensors[i].name; }

static size_t hash_probe(const kv_gguf *g, const int64_t *tab, size_t cap, name_of_fn nf, const char *s,
                         size_t len, int *found) {
    size_t m = cap - 1;
    size_t i = (size_t)kv_hash_fnv1a(s, len) & m;
    for (;;) {
        if (tab[i] < 0) {
            *found = 0;
            return i;
        }
        kv_gguf_str k = nf(g, tab[i]);
        if (k.len == len && memcmp(k.data, s, len) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & m;
    }
}

static int64_t *hash_new(size_t cap) {
    int64_t *t = malloc(cap * sizeof *t);
    if (t) memset(t, 0xff, cap * sizeof *t); /* all -1 */
    return t;
}

static void gguf_free_parts(kv_gguf *g) {
    if (g->kvs)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kvs[i].str_pos);
    free(g->kvs);
    free(g->tensors);
    free(g->t_info_pos);
    free(g->kv_hash);
    free(g->t_hash);
}

void kv_gguf_close(kv_gguf *g) {
    if (!g) return;
    gguf_free_parts(g);
    if (g->mapped && g->size) munmap((void *)g->buf, g->size);
    free(g);
}

static int has_nul(kv_gguf_str s) { return memchr(s.data, 0, s.len) != NULL; }

static int parse_kvs(kv_gguf *g, cursor *c, kv_err *err) {
    pctx p = {g->name, err, "header"};
    char nm[96], what[128];
    g->kv_hash_cap = hash_cap_for(g->n_kv);
    g->kv_hash = hash_new(g->kv_hash_cap);
    g->kvs = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kvs);
    if (!g->kv_hash || !g->kvs) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory for %lld keys", g->name,
                                                  (long long)g->n_kv);
    for (int64_t i = 0; i < g->n_kv; i++) {
        gg_kv *kv = &g->kvs[i];
        size_t at = c->pos;
        snprintf(what, sizeof what, "key #%lld", (long long)i);
        p.what = what;
        int rc = parse_str(&p, c, &kv->key, "name");
        if (rc) return rc;
        safe_name(kv->key.data, kv->key.len, nm);
        if (kv->key.len == 0)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: key #%lld at byte %zu has an empty name", g->name,
                              (long long)i, at);
        if (has_nul(kv->key))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' at byte %zu has a NUL byte in its name", g->name,
                              nm, at);
        snprintf(what, sizeof what, "key '%s'", nm);
        int found;
        size_t slot = hash_probe(g, g->kv_hash, g->kv_hash_cap, kv_name_of, kv->key.data, kv->key.len, &found);
        if (found)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: duplicate key '%s' at byte %zu (first at #%lld)", g->name,
                              nm, at, (long long)g->kv_hash[slot]);
        uint32_t t;
        size_t tat = c->pos;
        if (cur_u32(c, &t))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s': value type truncated at byte %zu (file ends at %zu)",
                              g->name, nm, tat, c->size);
        if (!vtype_valid(t))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s': unknown value type %u at byte %zu", g->name, nm,
                              t, tat);
        kv->type = (kv_gguf_vtype)t;
        kv->val_pos = c->pos;
        if (t == KV_GGUF_ARRAY) {
            uint32_t et;
            uint64_t n;
            if (cur_u32(c, &et) || cur_u64(c, &n))
                return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s': array header truncated at byte %zu (file ends at %zu)",
                                  g->name, nm, kv->val_pos, c->size);
            kv->elem_type = (kv_gguf_vtype)et;
            kv->n = n;
            kv->arr_pos = c->pos;
            if (et == KV_GGUF_STRING && n <= cur_left(c) / GGUF_MIN_STR_BYTES) {
                /* bounded by the bytes left, so this allocation is at most the file size */
                kv->str_pos = malloc((n ? (size_t)n : 1) * sizeof *kv->str_pos);
                if (!kv->str_pos)
                    return kv_err_set(err, KV_ERR_NOMEM, "%s: key '%s': out of memory indexing %llu strings",
                                      g->name, nm, (unsigned long long)n);
            }
            rc = parse_array_body(&p, c, et, n, 1, kv->str_pos);
        } else {
            rc = parse_value(&p, c, t, 0);
        }
        if (rc) return rc;
        kv->val_size = c->pos - kv->val_pos;
        g->kv_hash[slot] = i;
    }
    return 0;
}

static int parse_tensors(kv_gguf *g, cursor *c, kv_err *err) {
    pctx p = {g->name, err, "tensor"};
    char nm[96], what[128];
    if ((uint64_t)g->n_tensors > cur_left(c) / GGUF_MIN_TENSOR_BYTES)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: %lld tensor infos cannot fit in the %zu bytes left at byte %zu",
                          g->name, (long long)g->n_tensors, cur_left(c), c->pos);
    g->t_hash_cap = hash_cap_for(g->n_tensors);
    g->t_hash = hash_new(g->t_hash_cap);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    g->t_info_pos = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->t_info_pos);
    if (!g->t_hash || !g->tensors || !g->t_info_pos)
        return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory for %lld tensors", g->name, (long long)g->n_tensors);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kv_gguf_tensor *t = &g->tensors[i];
        size_t at = c->pos;
        g->t_info_pos[i] = at;
        snprintf(what, sizeof what, "tensor #%lld", (long long)i);
        p.what = what;
        int rc = parse_str(&p, c, &t->name, "name");
        if (rc) return rc;
        safe_name(t->name.data, t->name.len, nm);
        if (t->name.len == 0)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor #%lld at byte %zu has an empty name", g->name,
                              (long long)i, at);
        if (has_nul(t->name))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s' at byte %zu has a NUL byte in its name",
                              g->name, nm, at);
        int found;
        size_t slot = hash_probe(g, g->t_hash, g->t_hash_cap, t_name_of, t->name.data, t->name.len, &found);
        if (found)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: duplicate tensor '%s' at byte %zu (first is #%lld)",
                              g->name, nm, at, (long long)g->t_hash[slot]);
        uint32_t nd;
        size_t fat = c->pos;
        if (cur_u32(c, &nd))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': n_dims truncated at byte %zu (file ends at %zu)",
                              g->name, nm, fat, c->size);
        if (nd < 1 || nd > KV_GGUF_MAX_DIMS)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': n_dims %u at byte %zu (must be 1..%d)", g->name,
                              nm, nd, fat, KV_GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        for (int d = 0; d < KV_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            fat = c->pos;
            if (cur_u64(c, &ne))
                return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': ne[%u] truncated at byte %zu (file ends at %zu)",
                                  g->name, nm, d, fat, c->size);
            /* NOTE: zero-size dimensions are rejected: no model tensor is
             * empty, and an empty tensor would need a data pointer that may
             * sit at the very end of the file. */
            if (ne < 1 || ne > (uint64_t)INT64_MAX)
                return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': ne[%u] = %llu at byte %zu (must be >= 1)",
                                  g->name, nm, d, (unsigned long long)ne, fat);
            t->ne[d] = (int64_t)ne;
        }
        uint32_t ty;
        fat = c->pos;
        if (cur_u32(c, &ty))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': type truncated at byte %zu (file ends at %zu)",
                              g->name, nm, fat, c->size);
        const kv_type_traits *tr = ty < KV_TYPE_COUNT ? kv_type_get((int)ty) : NULL;
        if (!tr)
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': unknown type id %u at byte %zu", g->name, nm,
                              ty, fat);
        t->type = (kv_type)ty;
        if (t->ne[0] % tr->blck_size)
            return kv_err_set(err, KV_ERR_FORMAT,
                              "%s: tensor '%s': row length ne[0] = %lld is not a multiple of the %s block size %d "
                              "(info at byte %zu)",
                              g->name, nm, (long long)t->ne[0], tr->name, tr->blck_size, at);
        uint64_t nel = 1, bytes;
        for (int d = 0; d < KV_GGUF_MAX_DIMS; d++)
            if (kv_mul_overflow(nel, (uint64_t)t->ne[d], &nel) || nel > (uint64_t)INT64_MAX)
                return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': element count overflows (info at byte %zu)",
                                  g->name, nm, at);
        if (kv_mul_overflow(nel / (uint64_t)tr->blck_size, tr->type_size, &bytes))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': byte size overflows (info at byte %zu)", g->name,
                              nm, at);
        t->size = bytes;
        fat = c->pos;
        if (cur_u64(c, &t->offset))
            return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s': offset truncated at byte %zu (file ends at %zu)",
                              g->name, nm, fat, c->size);
        g->t_hash[slot] = i;
    }
    return 0;
}

/* Reads general.alignment (any integer type that fits u32; must be a power
 * of two), default 32. */
static int parse_alignment(kv_gguf *g, kv_err *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = kv_gguf_find_key(g, "general.alignment");
    if (i < 0) return 0;
    const gg_kv *kv = &g->kvs[i];
    if (!vtype_is_int(kv->type))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key 'general.alignment' at byte %zu is %s, not an integer",
                          g->name, kv->val_pos, vtype_names[kv->type]);
    int neg;
    uint64_t u;
    int64_t s;
    read_int(g->buf + kv->val_pos, kv->type, &neg, &u, &s);
    if (neg || u == 0 || u > UINT32_MAX || (u & (u - 1)))
        return kv_err_set(err, KV_ERR_FORMAT,
                          "%s: key 'general.alignment' = %lld at byte %zu is not a power of two in 1..2^31",
                          g->name, (long long)s, kv->val_pos);
    g->alignment = u;
    return 0;
}

static int place_tensors(kv_gguf *g, size_t info_end, kv_err *err) {
    uint64_t a = g->alignment, start;
    if (kv_add_overflow(info_end, a - 1, &start))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: data section offset overflows", g->name);
    start &= ~(a - 1);
    if (g->n_tensors == 0) {
        /* no data section needed; files without tensors (vocab-only) may
         * end right after the metadata, unpadded */
        g->data_offset = start > g->size ? g->size : (size_t)start;
        return 0;
    }
    if (start > g->size)
        return kv_err_set(err, KV_ERR_FORMAT,
                          "%s: data section at byte %llu (tensor infos end at %zu, aligned to %llu) is past the end "
                          "of the file (%zu bytes)",
                          g->name, (unsigned long long)start, info_end, (unsigned long long)a, g->size);
    g->data_offset = (size_t)start;
    size_t avail = g->size - g->data_offset;
    char nm[96];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kv_gguf_tensor *t = &g->tensors[i];
        safe_name(t->name.data, t->name.len, nm);
        if (t->offset & (a - 1))
            return kv_err_set(err, KV_ERR_FORMAT,
                              "%s: tensor '%s': data offset %llu is not a multiple of the alignment %llu (info at "
                              "byte %zu)",
                              g->name, nm, (unsigned long long)t->offset, (unsigned long long)a, g->t_info_pos[i]);
        uint64_t end;
        if (kv_add_overflow(t->offset, t->size, &end) || end > avail)
            return kv_err_set(err, KV_ERR_FORMAT,
                              "%s: tensor '%s': data [%llu, +%llu bytes) from data section byte %zu runs past the "
                              "end of the file (%zu bytes; info at byte %zu)",
                              g->name, nm, (unsigned long long)t->offset, (unsigned long long)t->size,
                              g->data_offset, g->size, g->t_info_pos[i]);
        t->data = g->buf + g->data_offset + t->offset;
    }
    return 0;
}

static int parse_all(kv_gguf *g, kv_err *err) {
    cursor c = {g->buf, g->size, 0};
    if (g->size < 4 || memcmp(g->buf, GGUF_MAGIC, 4) != 0)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: not a GGUF file (bad magic at byte 0)", g->name);
    if (g->size < GGUF_HEADER_BYTES)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: header truncated (%zu bytes, need %d)", g->name, g->size,
                          GGUF_HEADER_BYTES);
    uint32_t version;
    memcpy(&version, g->buf + 4, 4);
    if (version == 1)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: GGUF v1 is not supported (only v2 and v3; byte 4)",
                          g->name);
    if (version != 2 && version != 3) {
        if ((version & 0xffff) == 0 && version != 0)
            return kv_err_set(err, KV_ERR_UNSUPPORTED,
                              "%s: big-endian GGUF (version field 0x%08x at byte 4) is not supported", g->name,
                              version);
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: GGUF version %u at byte 4 is not supported (only 2 and 3)",
                          g->name, version);
    }
    g->version = version;
    uint64_t n_tensors, n_kv;
    c.pos = 8;
    cur_u64(&c, &n_tensors);
    cur_u64(&c, &n_kv);
    if (n_kv > cur_left(&c) / GGUF_MIN_KV_BYTES)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key count %llu at byte 16 cannot fit in the %zu bytes left",
                          g->name, (unsigned long long)n_kv, cur_left(&c));
    if (n_tensors > cur_left(&c) / GGUF_MIN_TENSOR_BYTES)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor count %llu at byte 8 cannot fit in the %zu bytes left",
                          g->name, (unsigned long long)n_tensors, cur_left(&c));
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    int rc = parse_kvs(g, &c, err);
    if (!rc) rc = parse_alignment(g, err);
    if (!rc) rc = parse_tensors(g, &c, err);
    if (!rc) rc = place_tensors(g, c.pos, err);
    return rc;
}

static kv_gguf *gguf_new(const char *name) {
    kv_gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    snprintf(g->name, sizeof g->name, "%s", name);
    return g;
}

kv_gguf *kv_gguf_open_mem(const void *buf, size_t size, kv_err *err) {
    if (!buf && size) {
        kv_err_set(err, KV_ERR_INVAL, "<memory>: NULL buffer");
        return NULL;
    }
    kv_gguf *g = gguf_new("<memory>");
    if (!g) {
        kv_err_set(err, KV_ERR_NOMEM, "<memory>: out of memory");
        return NULL;
    }
    g->buf = buf ? buf : (const uint8_t *)"";
    g->size = size;
    if (parse_all(g, err)) {
        kv_gguf_close(g);
        return NULL;
    }
    return g;
}

kv_gguf *kv_gguf_open(const char *path, kv_err *err) {
    if (!path) {
        kv_err_set(err, KV_ERR_INVAL, "kv_gguf_open: NULL path");
        return NULL;
    }
    /* Refuse what is not a regular file before open(): a FIFO with no
     * writer would block it forever. fstat below re-checks the file opened. */
    struct stat st;
    if (stat(path, &st) != 0) {
        kv_err_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        kv_err_set(err, KV_ERR_IO, "%s: %s", path,
                   S_ISDIR(st.st_mode) ? "is a directory, not a GGUF file"
                                       : "not a regular file (a pipe, device or socket); give a GGUF file");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        kv_err_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        kv_err_set(err, KV_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        kv_err_set(err, KV_ERR_IO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < GGUF_HEADER_BYTES) {
        close(fd);
        if (st.st_size >= 4) { /* still say "not GGUF" when the magic is wrong */
            unsigned char m[4] = {0};
            FILE *f = fopen(path, "rb");
            if (f && fread(m, 1, 4, f) == 4 && memcmp(m, GGUF_MAGIC, 4) != 0) {
                fclose(f);
                kv_err_set(err, KV_ERR_FORMAT, "%s: not a GGUF file (bad magic at byte 0)", path);
                return NULL;
            }
            if (f) fclose(f);
        }
        kv_err_set(err, KV_ERR_FORMAT, "%s: header truncated (%lld bytes, need %d)", path, (long long)st.st_size,
                   GGUF_HEADER_BYTES);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file alive */
    if (m == MAP_FAILED) {
        kv_err_set(err, KV_ERR_IO, "%s: mmap of %lld bytes failed: %s", path, (long long)st.st_size,
                   strerror(errno));
        return NULL;
    }
    kv_gguf *g = gguf_new(path);
    if (!g) {
        munmap(m, (size_t)st.st_size);
        kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    g->buf = m;
    g->size = (size_t)st.st_size;
    g->mapped = 1;
    if (parse_all(g, err)) {
        kv_gguf_close(g);
        return NULL;
    }
    return g;
}

uint32_t kv_gguf_version(const kv_gguf *g) { return g ? g->version : 0; }
uint64_t kv_gguf_alignment(const kv_gguf *g) { return g ? g->alignment : 0; }
size_t kv_gguf_file_size(const kv_gguf *g) { return g ? g->size : 0; }
size_t kv_gguf_data_offset(const kv_gguf *g) { return g ? g->data_offset : 0; }
const char *kv_gguf_name(const kv_gguf *g) { return g ? g->name : ""; }

/* --- metadata ----------------------------------------------------------- */

int64_t kv_gguf_n_kv(const kv_gguf *g) { return g ? g->n_kv : 0; }

int64_t kv_gguf_find_key(const kv_gguf *g, const char *key) {
    if (!g || !key || !g->kv_hash) return -1;
    int found;
    size_t slot = hash_probe(g, g->kv_hash, g->kv_hash_cap, kv_name_of, key, strlen(key), &found);
    return found ? g->kv_hash[slot] : -1;
}

kv_gguf_str kv_gguf_key_at(const kv_gguf *g, int64_t i) {
    kv_gguf_str none = {0, NULL};
    if (!g || i < 0 || i >= g->n_kv) return none;
    return g->kvs[i].key;
}

kv_gguf_vtype kv_gguf_type_at(const kv_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_kv) return (kv_gguf_vtype)-1;
    return g->kvs[i].type;
}

static const gg_kv *find_kv(const kv_gguf *g, const char *key) {
    int64_t i = kv_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* Integer getter core: reads an integer-typed value into sign/magnitude. */
static int get_int(const kv_gguf *g, const char *key, int *neg, uint64_t *u, int64_t *s, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (!vtype_is_int(kv->type))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not an integer (byte %zu)", g->name, key,
                          vtype_names[kv->type], kv->val_pos);
    read_int(g->buf + kv->val_pos, kv->type, neg, u, s);
    return 0;
}

int kv_gguf_get_u64(const kv_gguf *g, const char *key, uint64_t *out, kv_err *err) {
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, &neg, &u, &s, err);
    if (rc) return rc;
    if (neg)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %lld is negative", g->name, key, (long long)s);
    *out = u;
    return 0;
}

int kv_gguf_get_i64(const kv_gguf *g, const char *key, int64_t *out, kv_err *err) {
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, &neg, &u, &s, err);
    if (rc) return rc;
    if (!neg && u > (uint64_t)INT64_MAX)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %llu does not fit int64", g->name, key,
                          (unsigned long long)u);
    *out = s;
    return 0;
}

int kv_gguf_get_u32(const kv_gguf *g, const char *key, uint32_t *out, kv_err *err) {
    int neg;
    uint64_t u;
    int64_t s;
    int rc = get_int(g, key, &neg, &u, &s, err);
    if (rc) return rc;
    if (neg)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %lld does not fit uint32", g->name, key, (long long)s);
    if (u > UINT32_MAX)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' = %llu does not fit uint32", g->name, key,
                          (unsigned long long)u);
    *out = (uint32_t)u;
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
                      vtype_names[kv->type], kv->val_pos);
}

int kv_gguf_get_bool(const kv_gguf *g, const char *key, int *out, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != KV_GGUF_BOOL)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not a bool (byte %zu)", g->name, key,
                          vtype_names[kv->type], kv->val_pos);
    *out = g->buf[kv->val_pos] != 0;
    return 0;
}

int kv_gguf_get_str(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_err *err) {
    const gg_kv *kv = find_kv(g, key);
    if (!kv) return 1;
    if (kv->type != KV_GGUF_STRING)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key '%s' is %s, not a string (byte %zu)", g->name, key,
                          vtype_names[kv->type], kv->val_pos);
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
                          vtype_names[kv->type], kv->val_pos);
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
    if (!kv || kv->type != KV_GGUF_ARRAY || !vtype_fixed_size(kv->elem_type)) return NULL;
    return kv;
}

const void *kv_gguf_arr_data(const kv_gguf *g, const char *key) {
    const gg_kv *kv = numeric_arr(g, key);
    return kv ? g->buf + kv->arr_pos : NULL;
}

/* Element i of a fixed-size array as double (and, exactly, as int64). */
static int arr_elem(const kv_gguf *g, const gg_kv *kv, uint64_t i, double *d, int64_t *iv, int *iv_ok) {
    if (!kv || i >= kv->n) return -1;
    const uint8_t *p = g->buf + kv->arr_pos + i * vtype_fixed_size(kv->elem_type);
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
        read_int(p, kv->elem_type, &neg, &u, &s);
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
    size_t fs = vtype_fixed_size(t);
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
            read_int(p, t, &neg, &u, &v);
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

/* --- tensors ------------------------------------------------------------ */

int64_t kv_gguf_n_tensors(const kv_gguf *g) { return g ? g->n_tensors : 0; }

const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name) {
    if (!g || !name || !g->t_hash) return NULL;
    int found;
    size_t slot = hash_probe(g, g->t_hash, g->t_hash_cap, t_name_of, name, strlen(name), &found);
    return found ? &g->tensors[g->t_hash[slot]] : NULL;
}

int kv_gguf_str_eq(kv_gguf_str s, const char *c) {
    if (!c) return 0;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

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
    safe_name(key, strlen(key), nm);
    if (w_find_kv(w, key)) return w_fail(w, KV_ERR_INVAL, "gguf writer: duplicate key '%s'", nm);
    if (!strcmp(key, "general.alignment")) {
        uint32_t a;
        if (type != KV_GGUF_UINT32 || nval != 4)
            return w_fail(w, KV_ERR_INVAL, "gguf writer: general.alignment must be a uint32");
        memcpy(&a, val, 4);
        if (a == 0 || (a & (a - 1)))
            return w_fail(w, KV_ERR_INVAL, "gguf writer: general.alignment %u is not a power of two", a);
    }
    if (w->n_kv == w->cap_kv) {
        size_t nc = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = realloc(w->kvs, nc * sizeof *nk);
        if (!nk) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
        w->kvs = nk;
        w->cap_kv = nc;
    }
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
    size_t fs = vtype_fixed_size(type);
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
    size_t fs = vtype_fixed_size(elem_type);
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
    snprintf(what, sizeof what, "key '%s'", safe_name(k, strlen(k), nm));
    pctx p = {"gguf writer", &e, what};
    cursor c = {value ? value : (const void *)"", value ? nbytes : 0, 0};
    if (parse_value(&p, &c, (uint32_t)type, 0)) return w_fail(w, KV_ERR_INVAL, "%s", e.msg);
    if (c.pos != c.size)
        return w_fail(w, KV_ERR_INVAL, "gguf writer: key '%s': %zu trailing bytes after the %s value", nm,
                      c.size - c.pos, kv_gguf_vtype_name(type));
    return w_add(w, key, type, value, nbytes);
}

int kv_gguf_writer_copy_kv(kv_gguf_writer *w, const kv_gguf *g, int (*skip)(const char *key, void *ctx),
                           void *ctx) {
    if (!w || !g) return w_fail(w, KV_ERR_INVAL, "gguf writer: copy_kv from NULL");
    char *key = NULL;
    int rc = 0;
    for (int64_t i = 0; i < g->n_kv && !rc; i++) {
        const gg_kv *kv = &g->kvs[i];
        char *nk = realloc(key, (size_t)kv->key.len + 1);
        if (!nk) {
            rc = w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
            break;
        }
        key = nk;
        memcpy(key, kv->key.data, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        if (skip && skip(key, ctx)) continue;
        if (!strcmp(key, "general.alignment")) {
            rc = kv_gguf_writer_set_alignment(w, (uint32_t)g->alignment);
            continue;
        }
        rc = w_add(w, key, kv->type, g->buf + kv->val_pos, kv->val_size);
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
    safe_name(name, strlen(name), nm);
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
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->ts, nc * sizeof *nt);
        if (!nt) return w_fail(w, KV_ERR_NOMEM, "gguf writer: out of memory");
        w->ts = nt;
        w->cap_t = nc;
    }
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
    safe_name(name, strlen(name), nm);
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
