/* kv_ptree.c - the content-addressed prefix tree rebuilt from vLLM's KV
 * events (see kv_events.h): a hash table of resident blocks keyed by
 * (hash, medium, group), each naming its parent's hash, so chains are
 * found by lookup, never by pointers a hostile stream could corrupt
 * (cycles and missing parents are both handled when summarising). */
#include "kv_events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t key_hash(const kv_blockkey *k) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < k->len; i++) h = (h ^ k->b[i]) * 16777619u;
    h = (h ^ k->medium) * 16777619u;
    h = (h ^ k->group) * 16777619u;
    h = (h ^ k->is_int) * 16777619u;
    return h;
}

static int key_eq(const kv_blockkey *a, const kv_blockkey *b) {
    return a->len == b->len && a->is_int == b->is_int && a->medium == b->medium && a->group == b->group &&
           memcmp(a->b, b->b, a->len) == 0;
}

/* The slot holding key, or the empty slot where it would go. */
static uint32_t probe(const kv_ptree *t, const kv_blockkey *k) {
    uint32_t mask = t->cap - 1, i = key_hash(k) & mask;
    while (t->tab[i].used && !key_eq(&t->tab[i].key, k)) i = (i + 1) & mask;
    return i;
}

int kv_ptree_init(kv_ptree *t, uint32_t max_nodes, kv_err *err) {
    memset(t, 0, sizeof *t);
    if (max_nodes < 1 || max_nodes > (1u << 24)) return kv_err_set(err, KV_ERR_INVAL, "prefix tree: bad size %u", max_nodes);
    uint32_t cap = 16;
    while (cap < 2 * max_nodes) cap *= 2; /* at most half full: probes stay short */
    t->tab = calloc(cap, sizeof *t->tab);
    t->scratch = malloc((size_t)cap * 8 * sizeof *t->scratch);
    if (!t->tab || !t->scratch) {
        kv_ptree_free(t);
        return kv_err_set(err, KV_ERR_NOMEM, "prefix tree: out of memory");
    }
    t->cap = cap;
    t->max_nodes = max_nodes;
    t->c.last_seq = -1;
    return 0;
}

void kv_ptree_free(kv_ptree *t) {
    free(t->tab);
    free(t->scratch);
    memset(t, 0, sizeof *t);
}

void kv_ptree_clear(kv_ptree *t) {
    memset(t->tab, 0, (size_t)t->cap * sizeof *t->tab);
    t->n = 0;
}

const kv_ptree_node *kv_ptree_find(const kv_ptree *t, const kv_blockkey *key) {
    uint32_t i = probe(t, key);
    return t->tab[i].used ? &t->tab[i] : NULL;
}

/* Removes slot i, shifting the run after it back (no tombstones). */
static void remove_slot(kv_ptree *t, uint32_t i) {
    uint32_t mask = t->cap - 1, j = i;
    t->tab[i].used = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->tab[j].used) break;
        uint32_t home = key_hash(&t->tab[j].key) & mask;
        /* j's entry may move to i when its home is not in (i, j] cyclically */
        int in = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (in) continue;
        t->tab[i] = t->tab[j];
        t->tab[j].used = 0;
        i = j;
    }
    t->n--;
}

/* Chain depth of node i (1 = no resident parent), bounded. */
static int depth_of(const kv_ptree *t, uint32_t i) {
    int d = 1;
    while (t->tab[i].has_parent && d < 1 << 16) {
        uint32_t p = probe(t, &t->tab[i].parent);
        if (!t->tab[p].used || p == i) break;
        i = p;
        d++;
    }
    return d;
}

static void on_event(void *u, const kv_evbatch *b, const kv_ev *e) {
    kv_ptree *t = u;
    t->c.events++;
    if (e->type == KV_EV_CLEARED) {
        kv_ptree_clear(t);
        t->c.cleared++;
        return;
    }
    if (e->type == KV_EV_STORED) {
        t->c.block_size = e->block_size;
        for (int k = 0; k < e->n_hashes; k++) {
            uint32_t i = probe(t, &e->hashes[k]);
            if (!t->tab[i].used) {
                if (t->n >= t->max_nodes) {
                    t->c.dropped_full++;
                    continue;
                }
                t->n++;
            }
            kv_ptree_node *nd = &t->tab[i];
            nd->used = 1;
            nd->key = e->hashes[k];
            nd->has_parent = k > 0 || e->has_parent;
            if (k > 0) nd->parent = e->hashes[k - 1];
            else if (e->has_parent) nd->parent = e->parent;
            else memset(&nd->parent, 0, sizeof nd->parent);
            nd->tokens = e->block_size;
            nd->t_stored = b->ts;
            t->c.stored++;
        }
        return;
    }
    kv_ptree_evict *ev = &t->ev[t->ev_head];
    memset(ev, 0, sizeof *ev);
    ev->t = b->ts;
    ev->blocks = e->n_hashes;
    for (int k = 0; k < e->n_hashes; k++) {
        uint32_t i = probe(t, &e->hashes[k]);
        if (!t->tab[i].used) {
            t->c.removed_unknown++;
            continue;
        }
        if (!ev->known++) ev->depth = depth_of(t, i);
        remove_slot(t, i);
        t->c.removed++;
    }
    t->ev_head = (t->ev_head + 1) % KV_PTREE_EVICTS;
    if (t->ev_n < KV_PTREE_EVICTS) t->ev_n++;
}

int kv_ptree_apply(kv_ptree *t, const void *buf, size_t n, kv_err *err) {
    kv_evbatch b;
    kv_err e2;
    kv_err *e = err ? err : &e2;
    int rc = kv_evbatch_decode(buf, n, on_event, t, &b, e);
    if (rc) {
        t->c.rejected++;
        snprintf(t->last_error, sizeof t->last_error, "%.159s", e->msg);
        return rc;
    }
    t->c.batches++;
    t->c.unknown_events += (uint64_t)b.n_unknown;
    t->c.last_ts = b.ts;
    return 0;
}

uint64_t kv_ptree_seq(kv_ptree *t, int64_t seq) {
    uint64_t missed = 0;
    if (t->c.last_seq >= 0 && seq > t->c.last_seq + 1) {
        missed = (uint64_t)(seq - t->c.last_seq - 1);
        t->c.seq_gaps++;
        t->c.missed += missed;
    }
    t->c.last_seq = seq;
    return missed;
}
