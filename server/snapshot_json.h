/* snapshot_json.h - the engine snapshot as JSON, for GET /kvtop/v1/snapshot
 * and the frames of /kvtop/v1/stream (what `kvtop attach` reads): paused
 * and the step count, the configuration echo, requests with their state,
 * wait reason and block table, the queues, the block map (columns of one
 * entry per physical block), step records, decisions, metrics and the
 * memory breakdown. */
#ifndef KV_SRV_SNAPSHOT_JSON_H
#define KV_SRV_SNAPSHOT_JSON_H

#include <stdint.h>
#include <stdio.h>

#include "../engine/engine.h"
#include "../engine/json.h"

/* Writes s as one JSON object (no newline). since_step < 0: every step
 * record and decision the snapshot holds; otherwise only those of steps
 * after since_step (a stream's delta frame, marked "delta": true). model:
 * the served model name. check: NULL, or the result of kv_engine_check
 * ("" when clean, else its message) written as "check": {"ok", "message"}.
 * Returns 0, or KV_ERR_IO / KV_ERR_INVAL from the writer. */
int srv_snapshot_write(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check);
/* The same with the engine's load warnings (kv_engine_warnings: n_warnings
 * of them, NULL when none) as "warnings": [...] (srv_snapshot_write: []). */
int srv_snapshot_write_warned(FILE *f, const kv_snapshot *s, const char *model, int64_t since_step, const char *check,
                              const char (*warnings)[KV_WARNING_LEN], int n_warnings);

/* Writes "warnings": [...] (warnings[0..n), none when it is NULL) into the
 * object w has open: the engine's load warnings, as the snapshot and
 * /v1/models list them. */
void srv_write_warnings(kv_json_writer *w, const char (*warnings)[KV_WARNING_LEN], int n);

/* Names used in the JSON (also for tests); a finish reason is written
 * with kv_finish_name. */
const char *srv_req_state_name(kv_req_state st);

#endif
