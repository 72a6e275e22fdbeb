/* kv_events.c - vLLM's KV-event batches decoded from msgpack (see
 * kv_events.h for the layouts read). Each batch is read twice: once to
 * check it whole, then again to hand the events to the caller, so a batch
 * that goes bad half-way has changed nothing. */
#include "kv_events.h"

#include <stdlib.h>
#include <string.h>

#include "msgpack.h"

typedef struct dec {
    kv_mp m;
    const uint8_t *base;        /* the payload's first byte, for error offsets */
    kv_blockkey *keys;          /* (KV_EV_MAX_HASHES) scratch */
    kv_ev_fn fn;                /* NULL on the checking pass */
    void *u;
    kv_evbatch *b;
    kv_err *err;
} dec;

static int bad(dec *d, const char *what) {
    return kv_err_set(d->err, KV_ERR_FORMAT, "KV-event batch: %s (near byte %td)", what, d->m.p - d->base);
}

/* A block hash (int or bytes) into k; medium and group set by the caller. */
static int read_key(dec *d, kv_blockkey *k, int nil_ok, int *is_nil) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v)) return bad(d, "truncated block hash");
    memset(k, 0, sizeof *k);
    if (is_nil) *is_nil = 0;
    if (v.type == KV_MP_NIL && nil_ok) {
        *is_nil = 1;
        return 0;
    }
    if (v.type == KV_MP_INT) {
        for (int i = 0; i < 8; i++) k->b[i] = (uint8_t)(v.u >> (56 - 8 * i));
        k->len = 8;
        k->is_int = 1;
        return 0;
    }
    if (v.type == KV_MP_BIN || v.type == KV_MP_STR) {
        if (v.len == 0 || v.len > KV_EV_KEY_MAX) return bad(d, "a block hash of 0 or more than 32 bytes");
        memcpy(k->b, v.data, v.len);
        k->len = (uint8_t)v.len;
        return 0;
    }
    return bad(d, "a block hash that is neither an int nor bytes");
}

static int read_hashes(dec *d, int *n) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v) || v.type != KV_MP_ARRAY) return bad(d, "block_hashes is not an array");
    if (v.len > KV_EV_MAX_HASHES) return bad(d, "more than 4096 block hashes in one event");
    for (uint32_t i = 0; i < v.len; i++)
        if (read_key(d, &d->keys[i], 0, NULL)) return -1;
    *n = (int)v.len;
    return 0;
}

static int read_int(dec *d, int64_t lo, int64_t hi, int nil_ok, int64_t *out, const char *what) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v)) return bad(d, what);
    if (v.type == KV_MP_NIL && nil_ok) {
        *out = -1;
        return 0;
    }
    if (v.type != KV_MP_INT || v.is_unsigned || v.i < lo || v.i > hi) return bad(d, what);
    *out = v.i;
    return 0;
}

static int read_medium(dec *d, uint8_t *medium) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v)) return bad(d, "truncated medium");
    if (v.type == KV_MP_NIL || kv_mp_str_is(&v, "GPU")) *medium = KV_EV_MEDIUM_GPU;
    else if (kv_mp_str_is(&v, "CPU")) *medium = KV_EV_MEDIUM_CPU;
    else if (v.type == KV_MP_STR) *medium = KV_EV_MEDIUM_OTHER;
    else return bad(d, "medium is not a string");
    return 0;
}

static int read_tokens(dec *d, int *n) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v) || v.type != KV_MP_ARRAY) return bad(d, "token_ids is not an array");
    for (uint32_t i = 0; i < v.len; i++) {
        kv_mp_val t;
        if (kv_mp_read(&d->m, &t) || t.type != KV_MP_INT) return bad(d, "a token id that is not an int");
    }
    *n = (int)KV_MIN(v.len, (uint32_t)INT32_MAX);
    return 0;
}

/* Field names of the map layout, in the array layout's order. */
static const char *const STORED_F[] = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                       "medium", "lora_name", "extra_keys", "group_idx"};
static const char *const REMOVED_F[] = {"block_hashes", "medium", "group_idx"};

/* Reads field number f of an event of type t into e. */
static int read_field(dec *d, kv_ev_type t, int f, kv_ev *e, uint8_t *medium, int64_t *group, int *seen) {
    int64_t x;
    int nil = 0;
    if (t == KV_EV_STORED) {
        switch (f) {
        case 0: if (read_hashes(d, &e->n_hashes)) return -1; break;
        case 1:
            if (read_key(d, &e->parent, 1, &nil)) return -1;
            e->has_parent = !nil;
            break;
        case 2: if (read_tokens(d, &e->n_tokens)) return -1; break;
        case 3:
            if (read_int(d, 1, 1 << 20, 0, &x, "block_size is not an int in [1, 2^20]")) return -1;
            e->block_size = (int)x;
            break;
        case 5: if (read_medium(d, medium)) return -1; break;
        case 8: if (read_int(d, 0, 255, 1, group, "group_idx is not an int in [0, 255]")) return -1; break;
        default: if (kv_mp_skip(&d->m)) return bad(d, "a truncated field"); return 0;
        }
    } else if (t == KV_EV_REMOVED) {
        switch (f) {
        case 0: if (read_hashes(d, &e->n_hashes)) return -1; break;
        case 1: if (read_medium(d, medium)) return -1; break;
        case 2: if (read_int(d, 0, 255, 1, group, "group_idx is not an int in [0, 255]")) return -1; break;
        default: if (kv_mp_skip(&d->m)) return bad(d, "a truncated field"); return 0;
        }
    } else if (kv_mp_skip(&d->m)) {
        return bad(d, "a truncated field");
    }
    *seen |= 1 << f;
    return 0;
}

static int tag_of(const kv_mp_val *v) {
    if (kv_mp_str_is(v, "BlockStored")) return KV_EV_STORED;
    if (kv_mp_str_is(v, "BlockRemoved")) return KV_EV_REMOVED;
    if (kv_mp_str_is(v, "AllBlocksCleared")) return KV_EV_CLEARED;
    return v->type == KV_MP_STR ? 0 : -1;
}

/* One event as a map: {"type": tag, name: value, ...} in any order. The
 * tag may come after fields, so the fields are read on a second walk. */
static int read_event_map(dec *d, const kv_mp_val *hdr, kv_ev *e, uint8_t *medium, int64_t *group, int *seen) {
    kv_mp start = d->m;
    int t = -2;
    for (uint32_t i = 0; i < hdr->len; i++) {
        kv_mp_val k, v;
        if (kv_mp_read(&d->m, &k) || k.type != KV_MP_STR) return bad(d, "an event key that is not a string");
        if (kv_mp_str_is(&k, "type")) {
            if (kv_mp_read(&d->m, &v) || (t = tag_of(&v)) < 0) return bad(d, "an event type that is not a string");
        } else if (kv_mp_skip(&d->m)) {
            return bad(d, "a truncated event");
        }
    }
    if (t == -2) return bad(d, "an event without a type");
    e->type = (kv_ev_type)t;
    if (t == 0) return 0;
    kv_mp end = d->m;
    d->m = start;
    const char *const *names = t == KV_EV_STORED ? STORED_F : REMOVED_F;
    int nf = t == KV_EV_STORED ? 9 : t == KV_EV_REMOVED ? 3 : 0;
    for (uint32_t i = 0; i < hdr->len; i++) {
        kv_mp_val k;
        kv_mp_read(&d->m, &k); /* checked on the first walk */
        int f = -1;
        for (int j = 0; j < nf; j++)
            if (kv_mp_str_is(&k, names[j])) f = j;
        if (f < 0 || (*seen >> f & 1)) {
            if (kv_mp_skip(&d->m)) return bad(d, "a truncated event");
        } else if (read_field(d, e->type, f, e, medium, group, seen)) {
            return -1;
        }
    }
    d->m = end;
    return 0;
}

/* One event (array or map layout); calls fn on the second pass. */
static int read_event(dec *d) {
    kv_mp_val hdr, tag;
    kv_ev e;
    memset(&e, 0, sizeof e);
    uint8_t medium = KV_EV_MEDIUM_GPU;
    int64_t group = -1;
    int seen = 0, need;
    if (kv_mp_read(&d->m, &hdr)) return bad(d, "a truncated event");
    if (hdr.type == KV_MP_ARRAY) {
        if (hdr.len < 1 || kv_mp_read(&d->m, &tag)) return bad(d, "an event without a tag");
        int t = tag_of(&tag);
        if (t < 0) return bad(d, "an event tag that is not a string");
        e.type = (kv_ev_type)t;
        for (uint32_t f = 1; f < hdr.len; f++) {
            if (t == 0) {
                if (kv_mp_skip(&d->m)) return bad(d, "a truncated event");
            } else if (read_field(d, e.type, (int)KV_MIN(f - 1, 30u), &e, &medium, &group, &seen)) {
                return -1;
            }
        }
    } else if (hdr.type == KV_MP_MAP) {
        if (read_event_map(d, &hdr, &e, &medium, &group, &seen)) return -1;
        d->b->map_layout = 1;
    } else {
        return bad(d, "an event that is neither an array nor a map");
    }
    if (e.type == 0) {
        d->b->n_unknown++;
        return 0;
    }
    need = e.type == KV_EV_STORED ? 0xf : e.type == KV_EV_REMOVED ? 0x1 : 0;
    if ((seen & need) != need)
        return bad(d, e.type == KV_EV_STORED ? "BlockStored without block_hashes, parent_block_hash, token_ids and block_size"
                                             : "BlockRemoved without block_hashes");
    if (e.type == KV_EV_STORED) d->b->n_stored++;
    else if (e.type == KV_EV_REMOVED) d->b->n_removed++;
    else d->b->n_cleared++;
    d->b->n_events++;
    if (!d->fn) return 0;
    uint8_t g = group < 0 ? 0 : (uint8_t)group;
    for (int i = 0; i < e.n_hashes; i++) {
        d->keys[i].medium = medium;
        d->keys[i].group = g;
    }
    e.parent.medium = medium;
    e.parent.group = g;
    e.hashes = d->keys;
    d->fn(d->u, d->b, &e);
    return 0;
}

static int read_ts(dec *d) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v) || (v.type != KV_MP_FLOAT && v.type != KV_MP_INT) || v.f != v.f)
        return bad(d, "ts is not a number");
    d->b->ts = v.f;
    return 0;
}

static int read_events(dec *d) {
    kv_mp_val v;
    if (kv_mp_read(&d->m, &v) || v.type != KV_MP_ARRAY) return bad(d, "events is not an array");
    for (uint32_t i = 0; i < v.len; i++)
        if (read_event(d)) return -1;
    return 0;
}

static int read_rank(dec *d) {
    return read_int(d, 0, INT32_MAX, 1, &d->b->dp_rank, "data_parallel_rank is not an int");
}

static int read_batch(dec *d) {
    kv_mp_val v;
    memset(d->b, 0, sizeof *d->b);
    d->b->dp_rank = -1;
    if (kv_mp_read(&d->m, &v)) return bad(d, "empty or truncated");
    int have = 0;
    if (v.type == KV_MP_ARRAY) {
        if (v.len < 2) return bad(d, "a batch array shorter than [ts, events]");
        for (uint32_t i = 0; i < v.len; i++) {
            int rc = i == 0 ? read_ts(d) : i == 1 ? read_events(d) : i == 2 ? read_rank(d)
                   : (kv_mp_skip(&d->m) ? bad(d, "a truncated batch") : 0);
            if (rc) return -1;
        }
    } else if (v.type == KV_MP_MAP) {
        /* events are handed out in order; ts first is not required, so the
         * map is walked once for ts and the rank, then for the events */
        kv_mp start = d->m;
        for (int pass = 0; pass < 2; pass++) {
            d->m = start;
            for (uint32_t i = 0; i < v.len; i++) {
                kv_mp_val k;
                if (kv_mp_read(&d->m, &k) || k.type != KV_MP_STR) return bad(d, "a batch key that is not a string");
                int rc;
                if (pass == 0 && kv_mp_str_is(&k, "ts")) rc = read_ts(d), have |= 1;
                else if (pass == 0 && kv_mp_str_is(&k, "data_parallel_rank")) rc = read_rank(d);
                else if (pass == 1 && kv_mp_str_is(&k, "events")) rc = read_events(d), have |= 2;
                else rc = kv_mp_skip(&d->m) ? bad(d, "a truncated batch") : 0;
                if (rc) return -1;
            }
        }
        if (have != 3) return bad(d, "a batch map without ts and events");
    } else {
        return bad(d, "a batch that is neither an array nor a map");
    }
    if (d->m.p != d->m.end) return bad(d, "bytes after the batch");
    return 0;
}

int kv_evbatch_decode(const void *buf, size_t n, kv_ev_fn fn, void *u, kv_evbatch *out, kv_err *err) {
    kv_evbatch b;
    dec d = {kv_mp_init(buf, n), buf, NULL, NULL, u, &b, err};
    if (!buf && n) return kv_err_set(err, KV_ERR_INVAL, "KV-event batch: no buffer");
    d.keys = malloc(KV_EV_MAX_HASHES * sizeof *d.keys);
    if (!d.keys) return kv_err_set(err, KV_ERR_NOMEM, "KV-event batch: out of memory");
    int rc = read_batch(&d) ? KV_ERR_FORMAT : 0;
    if (!rc && fn) {
        d.m = kv_mp_init(buf, n);
        d.fn = fn;
        read_batch(&d); /* checked: cannot fail now */
    }
    free(d.keys);
    if (!rc && out) *out = b;
    return rc;
}
