/* trace.h - recording engine snapshots to a trace file, loading it back for
 * `kvtop replay FILE` (step forward and back through the recorded frames),
 * and exporting it as Chrome trace-event JSON (opens in Perfetto or
 * chrome://tracing): engine steps with their forward pass, decisions as
 * instant events, per-request spans and counters for blocks and queues.
 *
 * File format (NOTE: a binary dump tied to this build's struct layouts; the
 * header records every struct size and the loader rejects a mismatch, so a
 * trace from another build fails cleanly instead of misreading):
 *   "KVTRACE1", u32 version, u32 sizes[6] (snapshot, request, block, step,
 *   decision, int64), u32 len + profile text (the run's config as YAML),
 *   then frames: u32 'FRAM', the kv_snapshot struct (pointers meaningless),
 *   then its arrays in field order with the counts the struct gives. */
#ifndef KV_TUI_TRACE_H
#define KV_TUI_TRACE_H

#include <stdio.h>

#include "../engine/engine.h"

typedef struct kv_trace_writer kv_trace_writer;

/* Creates path and writes the header; profile_yaml may be NULL. NULL with
 * err naming the file on failure. */
kv_trace_writer *kv_trace_writer_open(const char *path, const char *profile_yaml, kv_err *err);
/* Appends s as a frame unless its step equals the last frame's (a paused
 * engine adds nothing). Returns 1 when written, 0 when skipped, negative
 * KV_ERR_IO on a write error (the writer then stays failed). */
int kv_trace_writer_add(kv_trace_writer *w, const kv_snapshot *s);
int kv_trace_writer_frames(const kv_trace_writer *w);
const char *kv_trace_writer_path(const kv_trace_writer *w);
/* Flushes and closes; returns 0 or KV_ERR_IO. NULL is a no-op returning 0. */
int kv_trace_writer_close(kv_trace_writer *w);

typedef struct kv_trace kv_trace;

/* Loads a whole trace. Truncated or inconsistent files are rejected with a
 * message naming the file and the frame; nothing is half-loaded. */
kv_trace *kv_trace_load(const char *path, kv_err *err);
/* The same from an open stream (read to its end, not closed); path names
 * it in messages. */
kv_trace *kv_trace_load_stream(FILE *f, const char *path, kv_err *err);
void kv_trace_free(kv_trace *t); /* NULL is a no-op */
int kv_trace_n_frames(const kv_trace *t);
/* Frame i (borrowed, valid until kv_trace_free), NULL when out of range. */
const kv_snapshot *kv_trace_frame(const kv_trace *t, int i);
/* The profile text stored in the header ("" when none). */
const char *kv_trace_profile(const kv_trace *t);

/* Writes the Chrome trace-event JSON. Steps and decisions seen in several
 * frames are written once. Returns 0, or KV_ERR_IO with err naming path. */
int kv_trace_export_chrome(const kv_trace *t, const char *path, kv_err *err);

#endif
