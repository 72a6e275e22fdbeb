/* gguf.c - GGUF v2/v3 reader (mmap or caller buffer); the v3 writer is
 * gguf_write.c. The reader validates the whole file once at open time (every
 * count, length and offset against the bytes that remain) and then serves
 * borrowed views into the buffer.
 *
 * NOTE: a little-endian host is assumed throughout: numbers are copied out of
 * the file with memcpy and never byte-swapped (GGUF is little-endian; a
 * big-endian file is recognised by its version field and rejected). */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"
#include "gguf_internal.h"

#include "../base/cleanup.h"
#include "../base/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host (see the NOTE above)"
#endif

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

size_t kv_gguf_vtype_fixed_size(uint32_t t) {
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
int kv_gguf_vtype_is_int(uint32_t t) {
    return t == KV_GGUF_UINT8 || t == KV_GGUF_INT8 || t == KV_GGUF_UINT16 || t == KV_GGUF_INT16 ||
           t == KV_GGUF_UINT32 || t == KV_GGUF_INT32 || t == KV_GGUF_UINT64 || t == KV_GGUF_INT64;
}

void kv_gguf_read_int(const uint8_t *p, uint32_t t, int *neg, uint64_t *u, int64_t *s) {
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

const char *kv_gguf_safe_name(const char *p, uint64_t len, char out[96]) {
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
    size_t fs = kv_gguf_vtype_fixed_size(t);
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
    size_t fs = kv_gguf_vtype_fixed_size(et);
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

/* Reads the name of entry #i (kind "key" or "tensor", which starts at byte
 * at) into *name (OUT) and its printable form into nm (OUT); an empty name
 * or one with a NUL byte is an error. While it reads, p->what points at
 * what (OUT, 128 bytes): "key #3". */
static int parse_entry_name(pctx *p, cursor *c, const char *kind, int64_t i, size_t at, char what[128],
                            kv_gguf_str *name, char nm[96]) {
    snprintf(what, 128, "%s #%lld", kind, (long long)i);
    p->what = what;
    int rc = parse_str(p, c, name, "name");
    if (rc) return rc;
    kv_gguf_safe_name(name->data, name->len, nm);
    if (name->len == 0)
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s #%lld at byte %zu has an empty name", p->fname, kind,
                          (long long)i, at);
    if (has_nul(*name))
        return kv_err_set(p->err, KV_ERR_FORMAT, "%s: %s '%s' at byte %zu has a NUL byte in its name", p->fname,
                          kind, nm, at);
    return 0;
}

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
        int rc = parse_entry_name(&p, c, "key", i, at, what, &kv->key, nm);
        if (rc) return rc;
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
        int rc = parse_entry_name(&p, c, "tensor", i, at, what, &t->name, nm);
        if (rc) return rc;
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
    if (!kv_gguf_vtype_is_int(kv->type))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: key 'general.alignment' at byte %zu is %s, not an integer",
                          g->name, kv->val_pos, vtype_names[kv->type]);
    int neg;
    uint64_t u;
    int64_t s;
    kv_gguf_read_int(g->buf + kv->val_pos, kv->type, &neg, &u, &s);
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
        kv_gguf_safe_name(t->name.data, t->name.len, nm);
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

int kv_gguf_validate_value(uint32_t t, const void *value, size_t nbytes, const char *what, size_t *used,
                           kv_err *err) {
    pctx p = {"gguf writer", err, what};
    cursor c = {value, nbytes, 0};
    int rc = parse_value(&p, &c, t, 0);
    *used = c.pos;
    return rc;
}
