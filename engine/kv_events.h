/* kv_events.h - vLLM's KV-cache events, as its ZMQ publisher sends them
 * (vllm/distributed/kv_events.py: multipart [topic, 8-byte big-endian
 * sequence, msgpack EventBatch]), decoded from the bytes (msgpack.c), and
 * the content-addressed prefix tree `kvtop attach --kv-events` rebuilds
 * from them: which blocks are resident, their parent chains, what was
 * evicted when, and how much of the resident chains is shared.
 *
 * The layouts read: EventBatch as an array [ts, events, data_parallel_rank?]
 * (msgspec array_like=True) or a map {ts, events, data_parallel_rank};
 * each event as a tagged array [tag, fields...] (array_like) or a map
 * {"type": tag, field: value...} (vLLM's current KVCacheEvent, which dropped
 * array_like), tag BlockStored / BlockRemoved / AllBlocksCleared. Array
 * fields by position, as vLLM declares them:
 *   BlockStored  [block_hashes, parent_block_hash, token_ids, block_size,
 *                 lora_id, medium, lora_name, extra_keys, group_idx, ...]
 *   BlockRemoved [block_hashes, medium, group_idx]
 * (trailing defaults may be omitted, later fields are skipped). A block
 * hash is an int or bytes (ExternalBlockHash = bytes | int), at most 32
 * bytes. A batch that breaks any of this is refused whole and changes
 * nothing; an event of an unknown tag is skipped and counted. */
#ifndef KV_ENGINE_KV_EVENTS_H
#define KV_ENGINE_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"

#define KV_EV_KEY_MAX 32      /* bytes of a block hash */
#define KV_EV_MAX_HASHES 4096 /* block hashes in one event */

/* A block's identity: its hash, on which medium, in which KV-cache group. */
typedef struct kv_blockkey {
    uint8_t b[KV_EV_KEY_MAX];
    uint8_t len;     /* bytes of b used (8 for an int hash) */
    uint8_t is_int;  /* bool: the hash came as an int (b: big-endian) */
    uint8_t medium;  /* KV_EV_MEDIUM_* */
    uint8_t group;   /* group_idx (0 when absent) */
} kv_blockkey;

enum { KV_EV_MEDIUM_GPU = 0 /* "GPU" or unset */, KV_EV_MEDIUM_CPU = 1, KV_EV_MEDIUM_OTHER = 2 };

typedef enum kv_ev_type { KV_EV_STORED = 1, KV_EV_REMOVED, KV_EV_CLEARED } kv_ev_type;

typedef struct kv_ev {
    kv_ev_type type;
    int n_hashes;
    const kv_blockkey *hashes;  /* (n_hashes), valid during the callback */
    int has_parent;             /* bool (BlockStored) */
    kv_blockkey parent;
    int n_tokens;               /* BlockStored: entries of token_ids */
    int block_size;             /* BlockStored */
} kv_ev;

typedef struct kv_evbatch {
    double ts;                  /* the batch's time (the publisher's clock, s) */
    int64_t dp_rank;            /* data_parallel_rank, -1 absent */
    int n_events, n_stored, n_removed, n_cleared, n_unknown;
    int map_layout;             /* bool: some event came as a map */
} kv_evbatch;

typedef void (*kv_ev_fn)(void *u, const kv_evbatch *b, const kv_ev *e);

/* Decodes one EventBatch payload, calling fn (may be NULL: only check) for
 * each event in order; out (may be NULL) gets the batch's figures. 0, or
 * KV_ERR_FORMAT (err says where) / KV_ERR_NOMEM. fn is called only when
 * the whole batch is well formed (it is read twice). */
int kv_evbatch_decode(const void *buf, size_t n, kv_ev_fn fn, void *u, kv_evbatch *out /* OUT: may be NULL */,
                      kv_err *err);

/* ---- the prefix tree ---- */

#define KV_PTREE_FAMILIES 8   /* chain families (roots) the view details */
#define KV_PTREE_GRID 4096    /* resident blocks the view lays out */
#define KV_PTREE_EVICTS 8     /* recent removals kept */

typedef struct kv_ptree_node {
    kv_blockkey key, parent;
    uint8_t used, has_parent;
    int32_t tokens;
    double t_stored;
} kv_ptree_node;

typedef struct kv_ptree_evict {
    double t;                   /* the batch's ts */
    int blocks;                 /* hashes in the event */
    int known;                  /* of them resident here */
    int depth;                  /* chain depth of the first known one (1 = a root), 0 none */
} kv_ptree_evict;

typedef struct kv_ptree_counts {
    uint64_t batches, events, stored, removed, removed_unknown, cleared, unknown_events;
    uint64_t dropped_full;      /* stores refused: the tree was at max_nodes */
    uint64_t rejected;          /* batches refused as malformed */
    uint64_t seq_gaps, missed;  /* sequence jumps seen, batches they skipped */
    int64_t last_seq;           /* -1 none yet */
    double last_ts;
    int block_size;             /* the last BlockStored's */
} kv_ptree_counts;

typedef struct kv_ptree {
    kv_ptree_node *tab;         /* open addressing, linear probing, (cap) */
    uint32_t cap, n, max_nodes;
    int32_t *scratch;           /* (8 * cap) for kv_ptree_summarize */
    kv_ptree_counts c;
    kv_ptree_evict ev[KV_PTREE_EVICTS];
    int ev_head, ev_n;
    char last_error[160];       /* why the last batch was refused */
} kv_ptree;

typedef struct kv_ptree_family {
    int blocks, leaves, depth, shared; /* depth: its longest chain in blocks */
} kv_ptree_family;

/* What the panel draws, computed from the tree. */
typedef struct kv_ptree_view {
    kv_ptree_counts c;
    int resident;               /* blocks */
    int64_t tokens;             /* tokens they hold */
    int roots;                  /* chains' first blocks (no resident parent) */
    int orphans;                /* of the roots, those whose parent was named but is not resident */
    int leaves, branch_points;  /* blocks with no resident child / with two or more */
    int shared;                 /* blocks on two or more leaf chains */
    int max_depth;
    uint64_t chain_blocks;      /* blocks summed over every root-to-leaf chain */
    double hit_potential;       /* 1 - resident / chain_blocks: the part of the chains a prefix hit serves */
    int n_fam;
    kv_ptree_family fam[KV_PTREE_FAMILIES]; /* the largest families, biggest first */
    int other_blocks;           /* blocks of the families not listed */
    int n_cells;
    uint8_t cell[KV_PTREE_GRID];/* resident blocks by family then depth: family rank (KV_PTREE_FAMILIES: others),
                                 * | KV_PTREE_CELL_SHARED */
    int ev_n;
    kv_ptree_evict ev[KV_PTREE_EVICTS]; /* newest first */
    char last_error[160];
} kv_ptree_view;
#define KV_PTREE_CELL_SHARED 0x80

/* A tree holding at most max_nodes blocks (>= 1). 0 or KV_ERR_NOMEM/INVAL. */
int kv_ptree_init(kv_ptree *t, uint32_t max_nodes, kv_err *err);
void kv_ptree_free(kv_ptree *t);
/* Applies one EventBatch payload: checked whole first; a malformed one is
 * counted in c.rejected (its reason in last_error and err) and changes
 * nothing else. 0 or the decode error. */
int kv_ptree_apply(kv_ptree *t, const void *buf, size_t n, kv_err *err);
/* Notes the sequence number of the batch about to be applied: a jump
 * forward counts a gap and the batches skipped; one backward (a publisher
 * restart) starts counting again. Returns the batches skipped (0 usual). */
uint64_t kv_ptree_seq(kv_ptree *t, int64_t seq);
/* Forgets every block (AllBlocksCleared does this too). */
void kv_ptree_clear(kv_ptree *t);
/* Fills out from t (uses t's scratch; not thread-safe on one t). */
void kv_ptree_summarize(kv_ptree *t, kv_ptree_view *out /* OUT: */);
/* The node of key, or NULL. */
const kv_ptree_node *kv_ptree_find(const kv_ptree *t, const kv_blockkey *key);

#endif
