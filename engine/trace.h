/* trace.h - recording engine snapshots to a trace file (one frame per engine
 * step), loading it back for `kvtop replay FILE` (step forward and back
 * through the recorded steps), and exporting it as Chrome trace-event JSON
 * (opens in Perfetto or chrome://tracing): engine steps with their forward
 * pass, decisions as instant events, per-request spans and counters for
 * blocks and queues. Engine data, not a screen: it lives in engine/ so any
 * front end can record, load or export a trace without curses (today the
 * TUI records and its replay viewer loads).
 *
 * File format, version 2 (NOTE: a binary dump tied to this build's struct
 * layouts; the header records every struct size and the loader rejects a
 * mismatch, so a trace from another build fails cleanly instead of
 * misreading). All integers are u32 in the host's byte order:
 *   "KVTRACE1", version (2), sizes[6] (snapshot, request, block, step,
 *   decision, int64), profile length + profile text (the run's config as
 *   YAML), then frames to the end of the file. A frame:
 *     'FRAM', flags (bit 0: the step history starts over, a new engine),
 *     n new step records, n new decisions, the records, the decisions,
 *     then seven arrays: the kv_snapshot struct itself as 8-byte words
 *     (pointers and capacities zeroed), requests, tables, running, waiting,
 *     swapped, blocks. Each array: count, mode, then
 *       mode 0 (full):  count elements;
 *       mode 1 (delta): n, then n x (index, element): the array is the
 *                       previous frame's cut or grown to count (grown
 *                       elements start zeroed) with those elements set.
 *   Step records and decisions are written once: each frame carries those
 *   newer than the previous frame's (a decision of an already written step,
 *   say a rejection between steps, counts as new once). A frame whose
 *   arrays are all full is a keyframe: the first frame is one; the writer
 *   makes another once 64 frames and as many delta bytes as the last
 *   keyframe's have come since it (so a frame is rebuilt from about two
 *   keyframes' bytes at most), and stores any array in full whenever that
 *   is smaller than its delta. A file cut at a frame boundary loads with
 *   the frames before the cut; a file cut inside a frame (a recording
 *   killed mid-write) loads with its complete frames too, and says so
 *   (kv_trace_truncated, kv_trace_end_note). */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include <stdio.h>

#include "engine.h"

typedef struct kv_trace_writer kv_trace_writer;

/* Creates path and writes the header; profile_yaml may be NULL. NULL with
 * err naming the file on failure. */
kv_trace_writer *kv_trace_writer_open(const char *path, const char *profile_yaml, kv_err *err);
/* Appends s as a frame unless its step equals the last frame's (a paused
 * engine adds nothing); a step lower than the last frame's starts the step
 * history over (a new engine). s is read, not kept. Returns 1 when written,
 * 0 when skipped, KV_ERR_NOMEM with nothing written (the next frame then
 * carries this one's step records), or KV_ERR_IO on a write error (the
 * writer then stays failed). Not thread safe: one thread adds at a time
 * (the engine's step hook, say). */
int kv_trace_writer_add(kv_trace_writer *w, const kv_snapshot *s);
/* The frames after this come from a new engine (its steps start again):
 * the next one is written as a restart even when its step number does not
 * go down. No-op before the first frame. */
void kv_trace_writer_restart(kv_trace_writer *w);
/* Frames written so far; safe to call from any thread while another adds. */
int kv_trace_writer_frames(const kv_trace_writer *w);
/* The file being written (borrowed, valid until close). */
const char *kv_trace_writer_path(const kv_trace_writer *w);
/* Flushes and closes; returns 0 or KV_ERR_IO. NULL is a no-op returning 0. */
int kv_trace_writer_close(kv_trace_writer *w);

typedef struct kv_trace kv_trace;

/* Loads a whole trace. A file that ends inside a frame (the recording was
 * cut off: a crash, SIGKILL, a full disk) loads every complete frame before
 * the cut, and nothing of the partial one; kv_trace_truncated then says so.
 * Inconsistent content (a bad marker, mode, flag or index, a count beyond
 * the format's caps, a delta before the first keyframe) and a cut inside
 * the header are rejected with a message naming the file and the frame;
 * nothing is half-loaded. The trace keeps the frames delta-encoded as in
 * the file plus every step record and decision once. */
kv_trace *kv_trace_load(const char *path, kv_err *err);
/* The same from an open stream (read to its end, not closed); path names
 * it in messages. */
kv_trace *kv_trace_load_stream(FILE *f, const char *path, kv_err *err);
void kv_trace_free(kv_trace *t); /* NULL is a no-op */
/* Frames in the trace (0 for NULL). */
int kv_trace_n_frames(const kv_trace *t);
/* 1 when the file ended inside a frame (only the frames before it
 * loaded; a front end shows kv_trace_end_note), 0 when it ends at a frame
 * boundary (or t is NULL). */
int kv_trace_truncated(const kv_trace *t);
/* How a truncated file ends, for front ends to show: "PATH: trace ends
 * mid-frame after frame N (M complete frames): the recording was cut off"
 * (N is the last complete frame, counted from 0; "... ends inside its
 * first frame ..." when none is complete). "" for a file that ends at a
 * frame boundary, and for NULL. Borrowed, valid until kv_trace_free. */
const char *kv_trace_end_note(const kv_trace *t);
/* Frame i, materialised from the nearest keyframe into a snapshot the trace
 * owns (a walk forward from the frame shown before costs one delta a
 * step). Its steps and decisions are the last ones up to that step, as
 * many as the engine's rings held, so it reads like a live snapshot. The
 * pointer (and every array it points to) is valid until the next
 * kv_trace_frame call or kv_trace_free; kv_trace_export_chrome leaves it
 * as it was. NULL when t is NULL or i is out of range. Block tables of
 * requests lie inside the tables array and strings are NUL-terminated
 * whatever the file held. */
const kv_snapshot *kv_trace_frame(kv_trace *t, int i);
/* The frame kv_trace_frame last returned, -1 none. */
int kv_trace_shown(const kv_trace *t);
/* The step records and decisions frame i added to the history (those after
 * frame i - 1's): *steps (OUT) [0, *n_steps (OUT)), *decisions (OUT)
 * [0, *n_decisions (OUT)); valid until kv_trace_free. Empty for a bad i. */
void kv_trace_frame_news(const kv_trace *t, int i, const kv_step_record **steps, size_t *n_steps,
                         const kv_decision **decisions, size_t *n_decisions);
/* The profile text stored in the header ("" when none). */
const char *kv_trace_profile(const kv_trace *t);

/* Writes the Chrome trace-event JSON: each step and decision once,
 * counters for every frame, each request as in the last frame that lists
 * it. Returns 0, or KV_ERR_IO with err naming path. */
int kv_trace_export_chrome(kv_trace *t, const char *path, kv_err *err);

#endif
