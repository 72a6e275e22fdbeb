/* gguf_internal.h - what the GGUF reader (gguf.c), its metadata reads
 * (gguf_meta.c) and the writer (gguf_write.c) share: the parsed file's
 * layout and the bounded cursor. Not part of the public GGUF interface. */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include "gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32

/* Bounded cursor over the input; invariant pos <= size. */
typedef struct cursor {
    const uint8_t *b;
    size_t size;
    size_t pos;
} cursor;

static inline size_t cur_left(const cursor *c) { return c->size - c->pos; }
static inline int cur_u32(cursor *c, uint32_t *v) {
    if (cur_left(c) < 4) return -1;
    memcpy(v, c->b + c->pos, 4);
    c->pos += 4;
    return 0;
}
static inline int cur_u64(cursor *c, uint64_t *v) {
    if (cur_left(c) < 8) return -1;
    memcpy(v, c->b + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A metadata entry as validated at open time. */
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

/* Bytes of one element of a fixed-size value type, 0 for string, array and
 * unknown types. */
size_t kv_gguf_vtype_fixed_size(uint32_t t);

/* Writes a possibly-binary name into out for an error message (printable
 * ASCII kept, everything else as \xNN, cut at about 64 bytes) and returns out. */
const char *kv_gguf_safe_name(const char *p, uint64_t len, char out[96]);

/* Validates one encoded value of type t (as it follows the type field in a
 * file) in the nbytes at value; *used (OUT) gets the bytes it spans. what
 * names the key in the message. Returns 0 or KV_ERR_FORMAT. */
int kv_gguf_validate_value(uint32_t t, const void *value, size_t nbytes, const char *what, size_t *used,
                           kv_err *err);

/* 1 when t is one of the eight integer value types. */
int kv_gguf_vtype_is_int(uint32_t t);

/* Reads one fixed-size integer element of type t at p as a sign/magnitude
 * pair: *neg (OUT) set when negative, *u (OUT) the value when not negative,
 * *s (OUT) the value as a signed integer (saturated at INT64_MAX). */
void kv_gguf_read_int(const uint8_t *p, uint32_t t, int *neg, uint64_t *u, int64_t *s);

#endif
