/* kv_events_sub.h - `kvtop attach --kv-events tcp://HOST:PORT`: a thread
 * subscribed to vLLM's KV-event publisher (ZMQ PUB, multipart [topic,
 * 8-byte big-endian sequence, msgpack EventBatch]) that rebuilds the
 * prefix tree (engine/kv_events.h) and hands the UI a summary of it. With
 * --kv-replay tcp://HOST:PORT (vLLM's replay ROUTER) it asks for the
 * batches it missed, at start and after a sequence gap. Built only with
 * libzmq (KV_HAVE_ZMQ); without it kv_kvsub_new says so. No curses here. */
#ifndef KV_TUI_KV_EVENTS_SUB_H
#define KV_TUI_KV_EVENTS_SUB_H

#include <stdint.h>

#include "../base/common.h"
#include "../engine/kv_events.h"

typedef struct kv_kvsub kv_kvsub;

typedef struct kv_kvsub_status {
    char endpoint[256];
    int have_batch;             /* bool: a batch was applied */
    double since_last_s;        /* seconds since the last message (any), -1 none */
    uint64_t bad_frames;        /* messages that were not [topic, 8-byte seq, payload] */
    uint64_t duplicates;        /* batches at or before the last sequence, skipped */
    uint64_t restarts;          /* the sequence went back to 0: the tree was cleared */
    uint64_t replays, replayed, replay_failed; /* requests sent, batches they brought, requests unanswered */
    char error[160];            /* the last failure ("" none) */
} kv_kvsub_status;

/* 1 when this kvtop was built with libzmq. */
int kv_kvsub_available(void);
/* A subscriber to endpoint ("tcp://HOST:PORT"), replay (NULL or the same
 * form) holding at most max_nodes blocks. NULL with err: a bad endpoint,
 * no libzmq in this build, out of memory. */
kv_kvsub *kv_kvsub_new(const char *endpoint, const char *replay, uint32_t max_nodes, kv_err *err);
/* Starts its thread. 0 or KV_ERR_IO. */
int kv_kvsub_start(kv_kvsub *s);
/* Stops (within ~100 ms), joins and frees. NULL is a no-op. */
void kv_kvsub_free(kv_kvsub *s);
/* When a summary newer than *seq is ready, copies it to out, sets *seq and
 * returns 1, else 0; st (may be NULL) gets the status either way. */
int kv_kvsub_take(kv_kvsub *s, kv_ptree_view *out /* OUT: */, uint64_t *seq /* IN/OUT */,
                  kv_kvsub_status *st /* OUT: may be NULL */);
/* 0 when s is "tcp://HOST:PORT" with a port in [1, 65535]; else
 * KV_ERR_INVAL with err. */
int kv_kvsub_check_endpoint(const char *s, kv_err *err);

#endif
