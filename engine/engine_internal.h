/* engine_internal.h - what the engine's files share and nothing else
 * includes: the request record, the engine struct with its locks, and the
 * functions one file of the engine calls in another. The engine is
 *   engine.c    creation, submission, polling, the thread and its controls
 *   step.c      one step: intake, schedule, forward, sample, stream, finish
 *   snapshot.c  plain-data snapshots, the published copy, metrics, checks
 *   ring.c      the record rings (steps, decisions, finished rows, events)
 *
 * Locks (always taken in this order: state_mu, then pub_mu or hook_mu,
 * then mu):
 *   state_mu  held for a whole step; guards the scheduler, cache, metrics,
 *             the live request table and the step/decision rings.
 *   pub_mu    the published snapshot copy that readers use mid-step.
 *   mu        the intake queue, cancellations, the event ring, the per-id
 *             table (active / finished text) and the thread controls.
 *   hook_mu   the step hook and its snapshot: taken with state_mu held
 *             after a step and kept while state_mu is released and the
 *             hook runs, so removing the hook waits for a call in flight. */
#ifndef KV_ENGINE_INTERNAL_H
#define KV_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "engine.h"
#include "forward.h"
#include "kv_cache.h"
#include "metrics.h"
#include "ring.h"
#include "sampler.h"
#include "scheduler.h"
#include "spec.h"
#include "synth_step.h"
#include "tokenizer.h"


enum {
    STEP_RING = 256,      /* step records kept (without tracing) */
    DECISION_RING = 1024, /* decisions kept (without tracing) */
    FINISHED_ROWS = 64,   /* finished requests shown in snapshots */
    MAX_STOP_LEN = 128    /* bytes per stop string */
};

/* One request as the engine sees it. */
typedef struct ereq {
    kv_sreq s;              /* the scheduler's view (tokens, state, blocks) */
    kv_sampling sampling;
    kv_rng rng;             /* seeded from sampling.seed + id: independent of batching */
    int ignore_eos;
    char **stop;            /* (n_stop) owned */
    int n_stop;
    int max_stop;           /* longest stop string, bytes */
    kv_detok detok;
    char *text;             /* (text_cap) generated text, complete UTF-8, stop string cut */
    size_t text_len, text_cap;
    size_t emitted;         /* bytes of text already sent in events */
    kv_req_metrics rm;
    kv_finish finish;
    kv_spec_seq ss;         /* speculative decoding: draft length, draft cache sequence, counters */
    struct ereq *held_prev, *held_next; /* in kv_engine.spec_held while held is set */
    int held;               /* bool: ss may hold draft-cache blocks (it was drafted for) */
    int logprobs;           /* bool: token events carry log-probabilities */
    int top_logprobs;       /* alternatives per token event, 0..KV_MAX_TOP_LOGPROBS */
} ereq;

/* What the engine remembers per id under mu. */
typedef struct id_rec {
    char *text;   /* finished: the reply (owned) */
    int len;
    uint8_t state; /* ID_* */
} id_rec;
enum { ID_NONE = 0, ID_ACTIVE = 1, ID_FINISHED = 2 };

struct kv_engine {
    kv_config cfg;
    kv_model *model;
    kv_backend *be;
    kv_cache *cache;
    kv_cache_params cache_params;
    uint8_t *swa_mask;              /* (n_layers) local layers under window release (cache_params.local_layers) */
    kv_sched *sched;
    kv_sched_params sp;
    kv_forward *fwd;
    kv_spec *spec;          /* speculative decoding, NULL when spec.method is off */
    kv_spec_item *items;    /* (max_seqs) the step's speculating requests */
    float *probs;           /* (n_vocab) verification scratch */
    kv_sampler *sampler;
    kv_metrics *metrics;
    float *logits;          /* (max_logits, n_vocab) */
    /* the backend's logits_scan of this step's rows (scanned: 1 when they
     * hold this step's rows): each row's argmax and whether it is finite */
    int32_t *scan_ids;      /* (max_logits) */
    uint8_t *scan_finite;   /* (max_logits) */
    int scanned;
    int max_logits;
    int n_vocab;
    int ctx;                /* tokens per request at most (prompt + output) */
    int spec_k;             /* draft slack per request */
    uint64_t block_bytes;
    uint64_t t0_ns;
    /* The clock: host wall time since t0_ns, or on the sim backend with
     * sim_clock on, the simulated device's clock plus the idle time a
     * driver skipped (kv_engine_advance_clock); both only move forward. */
    int virt;
    _Atomic double v_offset_ms;
    char *piece;            /* (piece_cap) detokenizer output */
    size_t piece_cap;

    pthread_mutex_t state_mu, pub_mu, mu;
    pthread_cond_t ev_cond;  /* events arrived / a step ended */
    pthread_cond_t ctl_cond; /* work arrived, controls changed */

    /* ---- under mu ---- */
    ereq **inbox;           /* (cap_inbox) submitted, not yet seen by a step */
    int n_inbox, cap_inbox;
    int64_t *cancels;       /* (cap_cancels) */
    int n_cancels, cap_cancels;
    kv_ring ev;             /* kv_event: published, not yet polled (no limit: never drops) */
    id_rec *ids;            /* (cap_ids) indexed by request id */
    int64_t cap_ids;
    int64_t next_id;
    int n_active;           /* submitted and not finished */
    kv_decision *pend_dec;  /* (cap_pend) rejections to record at the next step */
    int n_pend, cap_pend;
    double *pend_rej_ms;    /* (cap_pend) their times */
    int thread_started, paused, step_once, stop, step_delay_ms;
    _Atomic int sched_waiting; /* the scheduler's waiting + swapped at the last step's end, plus what
                                  engine_drain_inbox moved in since (changed with mu held, so
                                  n_inbox + sched_waiting read under mu never misses one) */
    _Atomic int sched_running;  /* requests running at the last step's end */
    uint64_t steps_done;    /* a copy of step for waiters */

    /* ---- under state_mu ---- */
    uint64_t step;
    ereq **live;            /* (cap_live) requests in the scheduler, by id: live[live_front ..
                               n_live); the slots before live_front are NULL (removals near
                               the front move the front up instead of the whole table) */
    int n_live, cap_live, live_front;
    ereq *spec_held;        /* requests whose ss may hold draft-cache blocks (a list through
                               held_next): the only ones a step gives blocks back for */
    kv_ring steps;          /* kv_step_record */
    kv_ring decisions;      /* kv_decision */
    kv_ring finished;       /* kv_snap_request of the latest finished */
    kv_event *lev;          /* (cap_lev) events of the current step */
    int n_lev, cap_lev;
    kv_block_info *bmap;    /* (n_blocks) scratch for snapshots */
    int trace;
    int64_t *cancel_scratch;
    int cap_cancel_scratch;
    ereq **sreqs;           /* (max_seqs) the step's scheduled requests */

    /* ---- published snapshot (pub_mu) ---- */
    kv_snapshot *pub, *pub_back;
    double last_reader_ms;  /* last kv_engine_snapshot call: publish while readers are around */
    int pub_filled;         /* pub holds a snapshot (not the empty initial one) */
    double pub_ms;          /* host wall ms the engine last published */

    /* ---- step hook (hook_mu; taken after state_mu, held across the call) ---- */
    pthread_mutex_t hook_mu;
    kv_step_hook hook;      /* NULL: none */
    void *hook_user;
    kv_snapshot *hook_snap; /* built after each step for the hook; allocated when the hook is set */

    pthread_t thread;

    kv_synth *synth;        /* a synthetic model's step-time model (synth_step.h), NULL otherwise:
                               then fwd and logits are NULL and steps are timed, not computed */
    double ev_at_ms;        /* > 0: the time the step's events and finishes of the request being
                               handled carry (a disaggregated prefill pool's first token) */

    /* ---- mixture of experts (engine_moe.c; state_mu) ---- */
    uint32_t expert_step[KV_MOE_MAX_EXPERTS];  /* tokens per expert of the last step, over layers */
    uint64_t expert_total[KV_MOE_MAX_EXPERTS]; /* the same since the last metrics reset */
    double expert_imb_sum;  /* sum over those steps of max / mean tokens per expert */
    uint64_t expert_imb_n;  /* steps that routed a token */
};

/* ---- engine_moe.c ---- */

/* Takes the step's routing from the forward (tokens per expert summed
 * over layers), fills rec's expert figures and adds them to the totals.
 * Nothing for a dense model. */
void engine_moe_step(kv_engine *e, kv_step_record *rec /* IN/OUT */);
/* The last step's per-expert counts into s (n_experts 0 for dense). */
void engine_moe_snapshot(const kv_engine *e, kv_snapshot *s /* OUT */);

/* ---- engine.c ---- */

/* The engine's clock in ms (see virt above). */
double engine_now_ms(const kv_engine *e);
/* The backend's modelled device seconds so far (ops.clock); 0 for a
 * backend on host time. */
double engine_device_s(const kv_engine *e);
/* Disaggregated pools: the earliest hold (kv_sreq.hold_until_ms) of a
 * running request still in the future, or 0 when none. */
double engine_next_hold_ms(kv_engine *e);
/* When nothing could run because requests are held: moves a virtual clock
 * to the earliest hold, at most max_ms ahead (<= 0: no bound). Returns 1
 * when it moved the clock. */
int engine_skip_to_hold(kv_engine *e, double max_ms);
/* Host wall time since creation in ms, whatever the engine's clock. */
static inline double engine_wall_ms(const kv_engine *e) { return (double)(kv_now_ns() - e->t0_ns) / 1e6; }
/* The forward pass's scratch plus the logits buffer: what the memory
 * breakdown calls activations, and what a memory.budget sets aside. */
uint64_t engine_activation_bytes(const kv_engine *e);
/* Sets *ts to ms milliseconds from now on CLOCK_MONOTONIC (the clock the
 * engine's condition variables wait on). */
void engine_deadline_after(struct timespec *ts /* OUT: */, int ms);
/* The same on another clock (pthread_mutex_timedlock wants CLOCK_REALTIME). */
void engine_deadline_on(clockid_t clock, struct timespec *ts /* OUT */, int ms);
/* Frees a request record (NULL is a no-op); its cache blocks must already
 * be back. */
void engine_ereq_free(ereq *r);

/* ---- step.c ---- */

/* Moves submitted requests into the scheduler and pending rejections into
 * the records (state_mu held). in_step: the rejections become decisions of
 * the step under way; otherwise they go straight into the record. */
void engine_drain_inbox(kv_engine *e, int in_step);
/* Ends r with `why` (reason: NULL or the DONE event's text) and frees it
 * (state_mu held). */
void engine_finish_req(kv_engine *e, ereq *r, kv_finish why, const char *reason);
/* Moves the live table's requests to its start (live_front = 0), so that
 * live[0 .. n_live) are all requests (state_mu held). */
void engine_live_compact(kv_engine *e);
/* One step with everything around it: takes state_mu, steps, publishes the
 * snapshot copy when `publish_copy` (the background thread), hands out the
 * step's events, releases state_mu and calls the step hook. Returns what a
 * step returns: 1 when it did something, 0 when idle, or a KV_ERR_* code. */
int engine_step_cycle(kv_engine *e, int publish_copy);

/* ---- snapshot.c ---- */

/* Fills o with r's row as snapshots show it. */
void engine_snap_row(const kv_engine *e, const ereq *r, kv_snap_request *o /* OUT: */);
/* Builds a snapshot from the live state (state_mu held). Returns 0 or
 * KV_ERR_NOMEM (s keeps its arrays, contents undefined). */
int engine_build_snapshot(kv_engine *e, kv_snapshot *s /* IN/OUT: arrays reused */);
/* After a step of the background thread (state_mu held): refreshes the
 * published copy while someone takes snapshots. */
void engine_publish(kv_engine *e);

#endif
