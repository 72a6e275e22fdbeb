/* msgpack.c - the MessagePack reader (see msgpack.h). */
#include "msgpack.h"

#include <string.h>

static uint64_t be(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x = (x << 8) | p[i];
    return x;
}

/* Sets v to a signed int of n bytes at p. */
static void sint(kv_mp_val *v, const uint8_t *p, int n) {
    uint64_t x = be(p, n);
    int64_t s;
    if (n < 8 && (x >> (8 * n - 1))) s = (int64_t)(x | ~((UINT64_C(1) << (8 * n)) - 1));
    else s = (int64_t)x;
    v->type = KV_MP_INT;
    v->i = s;
    v->u = (uint64_t)s;
    v->f = (double)s;
    v->is_unsigned = 0;
}

static void uint_(kv_mp_val *v, uint64_t x) {
    v->type = KV_MP_INT;
    v->u = x;
    v->i = (int64_t)x;
    v->f = (double)x;
    v->is_unsigned = x > (uint64_t)INT64_MAX;
}

int kv_mp_read(kv_mp *m, kv_mp_val *v) {
    memset(v, 0, sizeof *v);
    const uint8_t *p = m->p, *end = m->end;
    if (p >= end) return -1;
    uint8_t c = *p++;
    size_t room = (size_t)(end - p);
    uint64_t len = 0;
    int lenb = 0;          /* bytes of a length field that follow */
    kv_mp_type kind;
    if (c <= 0x7f) {
        uint_(v, c);
        m->p = p;
        return 0;
    } else if (c >= 0xe0) {
        v->type = KV_MP_INT;
        v->i = (int8_t)c;
        v->u = (uint64_t)v->i;
        v->f = (double)v->i;
        m->p = p;
        return 0;
    } else if (c <= 0x8f) {
        v->type = KV_MP_MAP;
        v->len = c & 0x0f;
        m->p = p;
        return 0;
    } else if (c <= 0x9f) {
        v->type = KV_MP_ARRAY;
        v->len = c & 0x0f;
        m->p = p;
        return 0;
    } else if (c <= 0xbf) {
        kind = KV_MP_STR;
        len = c & 0x1f;
    } else {
        switch (c) {
        case 0xc0: v->type = KV_MP_NIL; m->p = p; return 0;
        case 0xc2: case 0xc3: v->type = KV_MP_BOOL; v->i = c == 0xc3; m->p = p; return 0;
        case 0xc4: kind = KV_MP_BIN; lenb = 1; break;
        case 0xc5: kind = KV_MP_BIN; lenb = 2; break;
        case 0xc6: kind = KV_MP_BIN; lenb = 4; break;
        case 0xc7: kind = KV_MP_EXT; lenb = 1; break;
        case 0xc8: kind = KV_MP_EXT; lenb = 2; break;
        case 0xc9: kind = KV_MP_EXT; lenb = 4; break;
        case 0xca: case 0xcb: {
            int n = c == 0xca ? 4 : 8;
            if (room < (size_t)n) return -1;
            uint64_t x = be(p, n);
            v->type = KV_MP_FLOAT;
            if (n == 4) {
                uint32_t b = (uint32_t)x;
                float f;
                memcpy(&f, &b, 4);
                v->f = f;
            } else {
                memcpy(&v->f, &x, 8);
            }
            m->p = p + n;
            return 0;
        }
        case 0xcc: case 0xcd: case 0xce: case 0xcf: {
            int n = 1 << (c - 0xcc);
            if (room < (size_t)n) return -1;
            uint_(v, be(p, n));
            m->p = p + n;
            return 0;
        }
        case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
            int n = 1 << (c - 0xd0);
            if (room < (size_t)n) return -1;
            sint(v, p, n);
            m->p = p + n;
            return 0;
        }
        case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1..16 */
            kind = KV_MP_EXT;
            len = (uint64_t)1 << (c - 0xd4);
            if (room < 1) return -1;
            p++, room--; /* the ext type byte */
            break;
        case 0xd9: kind = KV_MP_STR; lenb = 1; break;
        case 0xda: kind = KV_MP_STR; lenb = 2; break;
        case 0xdb: kind = KV_MP_STR; lenb = 4; break;
        case 0xdc: case 0xdd: case 0xde: case 0xdf: {
            int n = (c == 0xdc || c == 0xde) ? 2 : 4;
            if (room < (size_t)n) return -1;
            v->type = c <= 0xdd ? KV_MP_ARRAY : KV_MP_MAP;
            v->len = (uint32_t)be(p, n);
            m->p = p + n;
            return 0;
        }
        default: return -1; /* 0xc1: never used */
        }
    }
    if (lenb) {
        if (room < (size_t)lenb) return -1;
        len = be(p, lenb);
        p += lenb;
        room -= (size_t)lenb;
        if (kind == KV_MP_EXT) {
            if (room < 1) return -1;
            p++, room--;
        }
    }
    if (len > room) return -1;
    v->type = kind;
    v->data = p;
    v->len = (uint32_t)len;
    m->p = p + len;
    return 0;
}

static int skip_depth(kv_mp *m, const kv_mp_val *v, int depth) {
    if (v->type != KV_MP_ARRAY && v->type != KV_MP_MAP) return 0;
    if (depth >= KV_MP_MAX_DEPTH) return -1;
    uint64_t n = v->type == KV_MP_MAP ? 2 * (uint64_t)v->len : v->len;
    for (uint64_t i = 0; i < n; i++) {
        kv_mp_val e;
        /* every element takes at least a byte: a count larger than the
         * bytes left ends here, not after 2^32 turns */
        if (kv_mp_read(m, &e) || skip_depth(m, &e, depth + 1)) return -1;
    }
    return 0;
}

int kv_mp_skip_contents(kv_mp *m, const kv_mp_val *v) { return skip_depth(m, v, 0); }

int kv_mp_skip(kv_mp *m) {
    kv_mp_val v;
    if (kv_mp_read(m, &v)) return -1;
    return skip_depth(m, &v, 0);
}

int kv_mp_str_is(const kv_mp_val *v, const char *s) {
    size_t n = strlen(s);
    return v->type == KV_MP_STR && v->len == n && memcmp(v->data, s, n) == 0;
}
