/* snapshot_parse.h - the reverse of server/snapshot_json.c: one JSON
 * snapshot (GET /kvtop/v1/snapshot, or a frame of /kvtop/v1/stream) back
 * into a kv_snapshot, for `kvtop attach` on a kvtop server. The text comes
 * from the network, so everything is checked: types, enum names, ranges,
 * and that every block id a request names lies inside the block map. */
#ifndef KV_SNAPSHOT_PARSE_H
#define KV_SNAPSHOT_PARSE_H

#include <stddef.h>

#include "../base/common.h"
#include "engine.h"
#include "json.h"

/* Step records kept across delta frames (a stream sends only new ones). */
#define KV_SNAPSHOT_PARSE_KEEP_STEPS 256
/* Decisions kept across delta frames likewise. */
#define KV_SNAPSHOT_PARSE_KEEP_DECISIONS 512
/* Largest block map, request list and queue accepted from a peer. */
#define KV_SNAPSHOT_PARSE_MAX_BLOCKS (1 << 22)
#define KV_SNAPSHOT_PARSE_MAX_REQUESTS (1 << 16)

/* Parses text[0..len) into s. A full frame replaces everything in s; a
 * delta frame ("delta": true) replaces everything but appends its step
 * records and decisions to those s holds (the newest
 * KV_SNAPSHOT_PARSE_KEEP_STEPS / _DECISIONS kept, older or repeated steps
 * dropped; a delta frame carries only its new steps' decisions, so a reader
 * that skips frames still sees every decision). model (may be NULL, else cap bytes) receives config.model, the
 * served model name. Missing members keep their neutral value (0, "", -1
 * for ttft/e2e); a member of the wrong type, an unknown enum name, a count
 * out of range or a block id outside the map rejects the whole frame.
 * Returns 0, or KV_ERR_FORMAT (err names the member: "requests[3].state:
 * unknown state 'x'") or KV_ERR_NOMEM; on error s is left as it was. */
int kv_snapshot_parse(const char *text, size_t len, kv_snapshot *s /* IN/OUT */, char *model /* OUT: may be NULL */,
                      size_t cap, kv_err *err);

/* Copies src into dst (arrays grown as needed). 0, or KV_ERR_NOMEM with dst
 * left empty (no requests, blocks, steps or decisions). */
int kv_snapshot_copy(kv_snapshot *dst /* OUT: arrays reused */, const kv_snapshot *src);

/* The groups of scalar members that the parser reads through its tables;
 * the writer (server/snapshot_json.c) writes them from the same tables. */
typedef enum kv_snap_part {
    KV_SNAP_PART_TOP,     /* kv_snapshot: step, now_ms, paused, thread_running, step_delay_ms */
    KV_SNAP_PART_CACHE,   /* kv_snapshot: the "cache" object's members */
    KV_SNAP_PART_MEMORY,  /* kv_mem_breakdown: the "memory" object's members */
    KV_SNAP_PART_REQUEST, /* kv_snap_request: a request's scalar members */
    KV_SNAP_PART_STEP     /* kv_step_record: a step record's members */
} kv_snap_part;

/* Writes the members of part, read from obj (the struct that part names),
 * into the object w has open: named, typed and in the order the parser
 * expects them. */
void kv_snapshot_write_part(kv_json_writer *w, kv_snap_part part, const void *obj);

#endif
