/* driver.h - a workload (workload.h) as timed kv_engine_submit calls: the
 * prompt ids of each item by one tokenization rule, its request (output
 * length, sampling, session tag), and when it is due (open loop: its
 * arrival time; closed loop: a free slot). `kvtop bench` and the TUI's load
 * key both drive their workloads through it, so the same profile sends the
 * same requests from either. The caller owns the loop: it steps the engine
 * (or lets its thread run), counts its requests in flight from their DONE
 * events, and asks the driver what is due on its clock.
 *
 *   kv_driver *d = kv_driver_new(e, cfg, &opts, &err);
 *   for (;;) {
 *       kv_driver_sub sub[16];
 *       int n = kv_driver_submit_due(d, kv_engine_now_ms(e), in_flight, sub, 16, &err);
 *       ... sub[k].id > 0: in flight until its DONE; 0: sub[k].reason says why not ...
 *   }
 */
#ifndef KV_DRIVER_H
#define KV_DRIVER_H

#include <stdint.h>

#include "../base/common.h"
#include "config.h"
#include "engine.h"
#include "tokenizer.h"
#include "workload.h"

typedef struct kv_driver kv_driver;

typedef struct kv_driver_opts {
    int pretokenize;   /* bool: tokenize every prompt in kv_driver_new, before any clock starts (bench);
                          otherwise each when it is submitted */
    int repeat;        /* bool: after the last item start over from the first (open loop: the arrival
                          times count from that moment); otherwise the driver runs dry */
    int closed_slots;  /* closed loop: requests kept in flight; 0 = workload.concurrency */
    int max_in_flight; /* open loop: submit nothing while this many are in flight; 0 = no limit */
    int fit_ctx;       /* > 0: cut an item's output so prompt + output fit this many tokens, and skip an
                          item whose prompt leaves no room; 0: submit as drawn (the engine rejects what
                          cannot fit, with a reason) */
    int seed_per_item; /* bool: sampling.seed + item index (the same text whatever the batching);
                          otherwise sampling.seed as configured */
    int session_base;  /* session tag of a request: session_base + item index, or with */
    int n_sessions;    /* n_sessions > 0, session_base + (requests submitted so far % n_sessions) */
} kv_driver_opts;

/* What happened to one item that came due. */
typedef struct kv_driver_sub {
    int index;         /* workload item */
    int64_t id;        /* engine request id (> 0), or 0 when it was not submitted */
    int prompt_tokens; /* prompt ids (BOS, system prompt, own text); 0 when they could not be built */
    int skipped;       /* bool (fit_ctx): not submitted, its prompt fills the context */
    char reason[128];  /* id 0 and not skipped: why ("prompt: ..." or the engine's refusal) */
} kv_driver_sub;

/* The one tokenization rule for workload prompts: the model's BOS when the
 * vocabulary asks for one, then kv_workload_tokens() with special-token
 * texts left as text (a workload prompt is a raw prompt, as `kvtop generate
 * -p` takes it: "<|im_start|>" in a prompts file is those characters, not
 * the control token). Writes the ids to out[0..cap) and returns their
 * number, or a negative KV_ERR_* with err filled (KV_ERR_RANGE when they
 * do not fit in cap). */
int kv_driver_prompt(const kv_workload *w, int i, const kv_tokenizer *tok, int32_t *out /* OUT: */, int cap,
                     kv_err *err);
/* An upper bound of kv_driver_prompt's count for item i (a cap that always fits). */
int kv_driver_prompt_bound(const kv_workload *w, int i, const kv_tokenizer *tok);

/* Builds cfg's workload (kv_workload_build's checks and errors: KV_ERR_INVAL
 * for a bad workload) for engine e (borrowed; its model's tokenizer cuts the
 * prompts), with o's choices (NULL: all 0). cfg is copied. With
 * o->pretokenize every prompt is built now; one that cannot be is reported
 * when its item comes due, it does not fail this call. NULL with err
 * filled on failure. */
kv_driver *kv_driver_new(kv_engine *e, const kv_config *cfg, const kv_driver_opts *o, kv_err *err);
void kv_driver_free(kv_driver *d); /* NULL is a no-op */

const kv_workload *kv_driver_workload(const kv_driver *d); /* borrowed */
int kv_driver_count(const kv_driver *d);                    /* items in the workload */
/* 1 when the workload is a closed loop (slots, no arrival times). */
int kv_driver_closed(const kv_driver *d);

/* Submits the items due at now_ms (the caller's clock in ms, which only
 * moves forward; the first call starts the workload's clock) with
 * in_flight of the driver's requests not yet done: open loop, every item
 * whose arrival time has come (while fewer than max_in_flight run); closed
 * loop, items while fewer than the slots are in flight. Handles at most
 * cap items, one out[] record each in order, and returns how many (0:
 * nothing due; cap: call again, more may be due), or a negative KV_ERR_*
 * (out of memory) with err filled. */
int kv_driver_submit_due(kv_driver *d, double now_ms, int in_flight, kv_driver_sub *out /* OUT: */, int cap,
                         kv_err *err);
/* Open loop: ms from now_ms until the next item arrives (<= 0: it is due),
 * for a caller that sleeps, or moves a virtual clock, until then. -1 when
 * no item waits for a time: a closed loop, or every item submitted. */
double kv_driver_next_wait_ms(const kv_driver *d, double now_ms);
/* Items not yet handed to kv_driver_submit_due (without repeat). */
int kv_driver_remaining(const kv_driver *d);

#endif
