/* msgpack.h - a reader of MessagePack (msgpack.org's spec), enough for the
 * KV-event batches vLLM publishes (kv_events.c). The bytes come from the
 * network: every read checks the bounds, a container's count is only
 * trusted as far as the bytes go, and nesting is capped, so hostile input
 * ends in an error, never a crash or a long loop. No allocation. */
#ifndef KV_MSGPACK_H
#define KV_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

#define KV_MP_MAX_DEPTH 32

typedef enum kv_mp_type {
    KV_MP_NIL = 0, KV_MP_BOOL, KV_MP_INT, KV_MP_FLOAT, KV_MP_STR, KV_MP_BIN, KV_MP_ARRAY, KV_MP_MAP, KV_MP_EXT
} kv_mp_type;

typedef struct kv_mp_val {
    kv_mp_type type;
    int is_unsigned;      /* KV_MP_INT: the value is u (it may exceed INT64_MAX) */
    int64_t i;            /* KV_MP_INT (signed view), KV_MP_BOOL (0/1) */
    uint64_t u;           /* KV_MP_INT (unsigned view; for a negative int, its bits) */
    double f;             /* KV_MP_FLOAT; also set for KV_MP_INT */
    const uint8_t *data;  /* KV_MP_STR / KV_MP_BIN / KV_MP_EXT: the bytes (not NUL-ended) */
    uint32_t len;         /* bytes of str/bin/ext; elements of an array; pairs of a map */
} kv_mp_val;

typedef struct kv_mp {
    const uint8_t *p, *end;
} kv_mp;

static inline kv_mp kv_mp_init(const void *buf, size_t n) {
    kv_mp m = {(const uint8_t *)buf, (const uint8_t *)buf + n};
    return m;
}

/* Reads one value's header (with a str/bin/ext payload) at m. For an array
 * or map, its elements follow and are read with further calls. 0, or -1 on
 * truncated or reserved bytes (m is then unchanged). */
int kv_mp_read(kv_mp *m, kv_mp_val *v /* OUT: */);
/* Skips one whole value (containers with their contents, to depth
 * KV_MP_MAX_DEPTH). 0 or -1. */
int kv_mp_skip(kv_mp *m);
/* Skips the contents of the container whose header v was just read. */
int kv_mp_skip_contents(kv_mp *m, const kv_mp_val *v);
/* 1 when v is a str equal to the NUL-ended s. */
int kv_mp_str_is(const kv_mp_val *v, const char *s);

#endif
