/* attach.c - `kvtop attach URL [URL ...]`: the TUI of a local run on remote
 * engines. There is no local engine: each URL is a source (source.c) whose
 * thread fills a snapshot the panels draw as they always do; the tabs chat
 * through the server's /v1/chat/completions (remote_chat.c) with TTFT and
 * TPOT measured here; F2/F3/F4 go to /kvtop/v1/control; F7 records the
 * snapshots that arrive, for `kvtop replay`. With several URLs, [ and ]
 * choose which one the panels show; the others keep being
 * followed and the tab bar says how each one is. */
#include "app_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"
#include "kv_events_sub.h"
#include "remote_chat.h"
#include "source.h"
#include "tui.h"

#define ATTACH_MAX_SOURCES 16
#define ATTACH_MAX_CHATS 64
/* Local ids of the tabs' replies, far from any remote engine's request ids
 * (so a tab's TTFT is never taken from an unrelated remote request). */
#define ATTACH_REQ_BASE ((int64_t)1 << 40)

typedef struct attach_chat {
    kv_remote_chat *c;
    int tag;                  /* the session's tag */
    int64_t req;              /* the local id its reply turn carries */
    int cancelled;            /* bool: the tab let go; freed once the thread ends */
    int n_deltas;             /* deltas taken so far */
    double gap_sum_ms;        /* for the reply's mean TPOT */
    int n_gap;
} attach_chat;

typedef struct attach_state {
    kv_source *src[ATTACH_MAX_SOURCES];
    kv_source_status st[ATTACH_MAX_SOURCES];
    uint64_t seq[ATTACH_MAX_SOURCES];
    int n_src;
    int sel;                  /* the source the panels show */
    attach_chat chats[ATTACH_MAX_CHATS];
    int n_chats;
    int64_t next_req;
    uint64_t rec_step;        /* last step added to a recording */
    int rec_have;
    /* --kv-events: the i-th subscriber goes with the i-th URL (NULL none) */
    kv_kvsub *kvs[ATTACH_MAX_SOURCES];
    kv_ptree_view *ptv[ATTACH_MAX_SOURCES];
    kv_kvsub_status kst[ATTACH_MAX_SOURCES];
    uint64_t kseq[ATTACH_MAX_SOURCES];
} attach_state;

/* What the command line asked for. */
typedef struct attach_args {
    const char *urls[ATTACH_MAX_SOURCES];
    int n_urls;
    const char *kv_events[ATTACH_MAX_SOURCES], *kv_replay[ATTACH_MAX_SOURCES];
    int n_kv_events, n_kv_replay;
    const char *key;
    kv_source_kind kind;
    long interval, frames;
} attach_args;

/* The KV-event subscribers the arguments name, started. 0, or 2 (bad
 * usage, said on stderr). */
static int kv_events_open(attach_state *t, const attach_args *g) {
    if (g->n_kv_replay > g->n_kv_events || g->n_kv_events > g->n_urls) {
        fprintf(stderr, "kvtop attach: each --kv-events goes with a URL (in order), each --kv-replay with a --kv-events\n");
        return 2;
    }
    for (int i = 0; i < g->n_kv_events; i++) {
        kv_err err;
        t->kvs[i] = kv_kvsub_new(g->kv_events[i], i < g->n_kv_replay ? g->kv_replay[i] : NULL, 1u << 17, &err);
        t->ptv[i] = t->kvs[i] ? calloc(1, sizeof *t->ptv[i]) : NULL;
        if (!t->kvs[i] || !t->ptv[i] || kv_kvsub_start(t->kvs[i])) {
            fprintf(stderr, "kvtop attach: --kv-events %s: %s\n", g->kv_events[i],
                    !t->kvs[i] ? err.msg : t->ptv[i] ? "cannot subscribe" : "out of memory");
            return 2;
        }
    }
    return 0;
}

/* The selected source's prefix tree into the view, when it has one. */
static void kv_events_frame(app *a, attach_state *t) {
    int i = t->sel;
    a->v.ptree = NULL;
    a->v.ptree_status = NULL;
    if (!t->kvs[i]) return;
    kv_kvsub_take(t->kvs[i], t->ptv[i], &t->kseq[i], &t->kst[i]);
    a->v.ptree = t->ptv[i];
    a->v.ptree_status = &t->kst[i];
}

static attach_state S;

static kv_session *session_by_tag(app *a, int tag) {
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->tag == tag) return a->sessions[i];
    return NULL;
}

void attach_submit(app *a, kv_session *s) {
    attach_state *t = a->att;
    if (t->n_chats >= ATTACH_MAX_CHATS) {
        app_note(s, "too many replies in flight");
        return;
    }
    const char *roles[512], *texts[512];
    int n = kv_session_messages(s, 0, roles, texts, 512);
    if (n < 0) {
        app_note(s, "the conversation has too many turns: /clear starts over");
        return;
    }
    kv_remote_chat_params p = {roles, texts, n, s->max_tokens, s->sampling.temperature};
    kv_err err;
    kv_remote_chat *c = kv_remote_chat_start(t->src[t->sel], &p, &err);
    if (!c) {
        app_note(s, "cannot send: %s", err.msg);
        return;
    }
    int64_t id = ++t->next_req;
    if (kv_session_reply_begin(s, id) < 0) {
        kv_remote_chat_free(c);
        app_note(s, "out of memory");
        return;
    }
    attach_chat *ac = &t->chats[t->n_chats++];
    memset(ac, 0, sizeof *ac);
    ac->c = c;
    ac->tag = s->tag;
    ac->req = id;
}

void attach_cancel(app *a, kv_session *s) {
    attach_state *t = a->att;
    for (int i = 0; i < t->n_chats; i++)
        if (t->chats[i].req == s->req && !t->chats[i].cancelled) {
            kv_remote_chat_cancel(t->chats[i].c);
            t->chats[i].cancelled = 1;
        }
}

/* A finished reply: how it ended, into the tab. */
static void chat_finish(app *a, kv_session *s, const kv_remote_chat_news *n) {
    kv_turn *turn = kv_session_reply(s, s->req);
    int tokens = turn ? turn->n_tokens : 0;
    int fin = n->error[0]                    ? KV_FINISH_ERROR
              : !strcmp(n->finish, "length") ? KV_FINISH_LENGTH
                                             : KV_FINISH_EOS;
    kv_session_reply_end(s, fin);
    if (n->error[0]) app_note(s, "[error: %s]", n->error);
    else if (fin == KV_FINISH_LENGTH) app_note(s, "[reply cut at %d tokens: /max N for longer]", tokens);
    if (n->cache_n >= 0 && n->prompt_n >= 0)
        app_note(s, "[prefix cache: %d of %d prompt tokens reused]", n->cache_n, n->cache_n + n->prompt_n);
    if (s != app_cur(a)) s->unread = 1;
}

/* Moves one reply's new text and timings into its tab; 1 when it is over. */
static int chat_take(app *a, attach_chat *ac) {
    char buf[4096];
    kv_remote_chat_news n;
    kv_session *s = ac->cancelled ? NULL : session_by_tag(a, ac->tag);
    kv_turn *turn = s ? kv_session_reply(s, ac->req) : NULL;
    for (int round = 0; round < 64; round++) {
        size_t got = kv_remote_chat_poll(ac->c, buf, sizeof buf, &n);
        if (turn && got) kv_session_reply_append(s, buf, got, 0);
        for (int g = 0; turn && g < n.n_gaps; g++) {
            kv_series_push(&s->itl, n.gaps_ms[g]);
            kv_series_push(&a->itl_all, n.gaps_ms[g]);
            ac->gap_sum_ms += n.gaps_ms[g];
            ac->n_gap++;
        }
        if (got < sizeof buf && n.n_gaps < 64) break;
    }
    if (turn) {
        turn->n_tokens = n.n_deltas;
        turn->ttft_ms = n.ttft_ms;
        if (ac->n_gap) turn->tpot_ms = ac->gap_sum_ms / ac->n_gap;
        if (n.n_deltas > ac->n_deltas && s != app_cur(a)) s->unread = 1;
        ac->n_deltas = n.n_deltas;
    }
    if (!n.done) return 0;
    if (turn) chat_finish(a, s, &n);
    return 1;
}

void attach_poll(app *a) {
    attach_state *t = a->att;
    for (int i = 0; i < t->n_chats;) {
        if (chat_take(a, &t->chats[i])) {
            kv_remote_chat_free(t->chats[i].c);
            t->chats[i] = t->chats[--t->n_chats];
        } else {
            i++;
        }
    }
    for (int i = 0; i < a->n_sessions; i++) kv_session_autosave_flush(a->sessions[i]);
}

void attach_control(app *a, const char *action, int delay_ms) {
    attach_state *t = a->att;
    kv_source *src = t->src[t->sel];
    int rc = kv_source_control(src, action, delay_ms);
    if (rc == KV_ERR_UNSUPPORTED) {
        const char *why = kv_source_na_reason(kv_source_kind_of(src), KV_SF_CONTROL);
        app_status(a, 1, "%s", why ? why : "this server has no control endpoint");
    } else if (rc) {
        app_status(a, 1, "control requests are queueing up: the server is slow to answer");
    } else if (!strcmp(action, "slow")) {
        a->v.step_delay_ms = delay_ms;
        app_status(a, 0, "remote slow motion: %d ms per step", delay_ms);
    } else {
        app_status(a, 0, "remote %s sent", action);
    }
}

/* "host:port up" / "STALE 12s" / "connecting" for the tab bar. */
static void describe(const kv_source_status *st, int i, int n, char *out, size_t cap) {
    const char *host = strstr(st->url, "://");
    host = host ? host + 3 : st->url;
    double now = app_wall_s();
    char state[64];
    if (st->up) snprintf(state, sizeof state, "%s", kv_source_kind_name(st->kind));
    else if (st->last_ok_s > 0) snprintf(state, sizeof state, "STALE %.0fs", now - st->last_ok_s);
    else snprintf(state, sizeof state, "connecting");
    char rej[32] = "";
    if (st->rejected) snprintf(rej, sizeof rej, " rejected %llu", (unsigned long long)st->rejected);
    if (n > 1) snprintf(out, cap, "[%d/%d] %.60s %s%s", i + 1, n, host, state, rej);
    else snprintf(out, cap, "%.60s %s%s", host, state, rej);
}

static void attach_frame(app *a) {
    attach_state *t = a->att;
    for (int i = 0; i < t->n_src; i++) {
        if (i != t->sel) {
            kv_source_take(t->src[i], NULL, &t->seq[i], &t->st[i]); /* status only */
            continue;
        }
        int rc = kv_source_take(t->src[i], a->snap, &t->seq[i], &t->st[i]);
        if (rc == 1) {
            a->have_snap = 1;
            app_after_snapshot(a, a->snap);
            a->paused = a->snap->paused;
            a->v.step_delay_ms = a->snap->step_delay_ms;
            if (a->rec && (!t->rec_have || a->snap->step != t->rec_step)) {
                int e = kv_trace_writer_add(a->rec, a->snap);
                if (e < 0) atomic_store(&a->rec_err, e);
                t->rec_step = a->snap->step;
                t->rec_have = 1;
            }
        }
    }
    if (a->rec && atomic_load(&a->rec_err)) record_stop(a);
    const kv_source_status *st = &t->st[t->sel];
    a->v.phase = a->have_snap ? KV_PHASE_READY : KV_PHASE_LOADING;
    describe(st, t->sel, t->n_src, a->v.remote, sizeof a->v.remote);
    a->v.remote_status = st;
    a->v.remote_metrics = st->kind != KV_SOURCE_KVTOP && st->kind != KV_SOURCE_AUTO;
    a->v.fleet = t->n_src > 1 ? t->st : NULL;
    a->v.n_fleet = t->n_src;
    a->v.fleet_sel = t->sel;
    kv_events_frame(a, t);
    if (!a->v.status[0] && st->error[0] && !st->up) app_status(a, 1, "%s", st->error);
    if (!a->v.status[0] && st->control_msg[0] && strstr(st->control_msg, "fail")) app_status(a, 1, "%s", st->control_msg);
    chat_poll_events(a);
    a->shown = a->have_snap ? a->snap : NULL;
    app_clamp_scroll(a);
    app_draw(a);
    a->v.frames++;
    app_update_cpu(a);
}

/* [ and ] pick the engine the panels show; everything else as in the app. */
static void attach_key(app *a, kv_key k) {
    attach_state *t = a->att;
    if (t->n_src > 1 && a->v.focus == KV_FOCUS_PANELS && (k.code == '[' || k.code == ']')) {
        t->sel = (t->sel + (k.code == ']' ? 1 : t->n_src - 1)) % t->n_src;
        t->seq[t->sel] = 0; /* take its snapshot at the next frame */
        a->have_snap = 0;
        a->log_n = a->log_head = 0;
        a->log_have = 0;
        app_status(a, 0, "showing %s", t->st[t->sel].url);
        return;
    }
    commands_key(a, k);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: kvtop attach URL [URL ...] [--api-key KEY] [--kind auto|kvtop|vllm|sglang|llamacpp|tgi]\n"
            "                    [--interval MS] [--frames N] [--kv-events tcp://HOST:PORT [--kv-replay tcp://HOST:PORT]]\n"
            "  shows a running server in the TUI's panels: a kvtop server (every panel, F2/F3/F4 drive it)\n"
            "  or the metrics a vLLM, SGLang, llama.cpp or TGI server exports (what it does not export is N/A).\n"
            "  Tabs chat through its /v1/chat/completions. Several URLs: [ and ] (panels focus) switch.\n"
            "  --api-key KEY  sent as a bearer token to these URLs only (also $KVTOP_API_KEY)\n"
            "  --kind K       skip detection\n"
            "  --interval MS  snapshot / scrape interval (default: 100 for a kvtop stream, 1000 for /metrics)\n"
            "  --frames N     exit after N frames (tests)\n"
            "  --kv-events EP subscribe to vLLM's KV-event publisher (--kv-events-config endpoint) and draw the\n"
            "                 prefix tree its events rebuild in the block panel; one per URL, in order%s\n"
            "  --kv-replay EP its replay socket (replay_endpoint): ask for missed batches at start and after a gap\n",
            kv_kvsub_available() ? "" : " (this build has no libzmq: unavailable)");
}

/* Parses the command line into g; 0, 1 (help shown) or 2 (bad usage). */
static int parse_args(int argc, char **argv, attach_args *g) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        int has = i + 1 < argc;
        char *end = NULL;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(s, "--api-key") && has) {
            g->key = argv[++i];
        } else if (!strcmp(s, "--kind") && has) {
            if (kv_source_kind_parse(argv[++i], &g->kind)) {
                fprintf(stderr, "kvtop attach: --kind must be auto, kvtop, vllm, sglang, llamacpp or tgi, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if ((!strcmp(s, "--kv-events") || !strcmp(s, "--kv-replay")) && has) {
            int ev = s[5] == 'e';
            kv_err err;
            if ((ev ? g->n_kv_events : g->n_kv_replay) >= ATTACH_MAX_SOURCES || kv_kvsub_check_endpoint(argv[++i], &err)) {
                fprintf(stderr, "kvtop attach: %s: %s\n", s, (ev ? g->n_kv_events : g->n_kv_replay) >= ATTACH_MAX_SOURCES ? "too many" : err.msg);
                return 2;
            }
            if (ev) g->kv_events[g->n_kv_events++] = argv[i];
            else g->kv_replay[g->n_kv_replay++] = argv[i];
        } else if ((!strcmp(s, "--interval") || !strcmp(s, "--frames")) && has) {
            long v = strtol(argv[++i], &end, 10);
            long lo = s[2] == 'i' ? 20 : 1, hi = s[2] == 'i' ? 60000 : 100000000;
            if (!argv[i][0] || *end || v < lo || v > hi) {
                fprintf(stderr, "kvtop attach: %s needs a number in [%ld, %ld], got '%s'\n", s, lo, hi, argv[i]);
                return 2;
            }
            *(s[2] == 'i' ? &g->interval : &g->frames) = v;
        } else if (s[0] == '-') {
            fprintf(stderr, "kvtop attach: unknown option or missing value '%s' (see --help)\n", s);
            return 2;
        } else if (g->n_urls >= ATTACH_MAX_SOURCES) {
            fprintf(stderr, "kvtop attach: at most %d URLs\n", ATTACH_MAX_SOURCES);
            return 2;
        } else {
            g->urls[g->n_urls++] = s;
        }
    }
    if (g->n_urls == 0) {
        fprintf(stderr, "kvtop attach: which server? (kvtop attach http://HOST:PORT)\n");
        return 2;
    }
    return 0;
}

/* One line per source on stderr after the screen is gone: what attach cost
 * (requests sent, snapshots taken in, the process's CPU over the run), for
 * the README's overhead figures (tools/attach_overhead.sh). */
static void report(const attach_state *t, double wall_s) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
                 ru.ru_stime.tv_usec * 1e-6;
    for (int i = 0; i < t->n_src; i++) {
        kv_source_status st;
        uint64_t seq = 0;
        kv_source_take(t->src[i], NULL, &seq, &st);
        fprintf(stderr, "kvtop attach: %s (%s): %llu requests, %llu snapshots, %llu rejected in %.1f s\n", st.url,
                kv_source_kind_name(st.kind), (unsigned long long)st.requests, (unsigned long long)st.frames,
                (unsigned long long)st.rejected, wall_s);
    }
    fprintf(stderr, "kvtop attach: process CPU %.2f s over %.1f s (%.1f%% of a core)\n", cpu, wall_s,
            wall_s > 0 ? 100 * cpu / wall_s : 0);
}

static void attach_free_sources(attach_state *t) {
    for (int i = 0; i < t->n_src; i++) kv_source_free(t->src[i]);
    t->n_src = 0;
    for (int i = 0; i < ATTACH_MAX_SOURCES; i++) {
        kv_kvsub_free(t->kvs[i]);
        free(t->ptv[i]);
        t->kvs[i] = NULL;
        t->ptv[i] = NULL;
    }
}

static void attach_free(app *a) {
    attach_state *t = a->att;
    if (a->rec) record_stop(a);
    for (int i = 0; i < t->n_chats; i++) kv_remote_chat_free(t->chats[i].c);
    attach_free_sources(t);
    app_free_views(a);
}

int cmd_attach(int argc, char **argv) {
    attach_args g;
    memset(&g, 0, sizeof g);
    g.key = getenv("KVTOP_API_KEY");
    g.kind = KV_SOURCE_AUTO;
    int prc = parse_args(argc, argv, &g);
    if (prc) return prc == 1 ? 0 : 2;
    const char **urls = g.urls, *key = g.key;
    int n_urls = g.n_urls;
    kv_source_kind kind = g.kind;
    long interval = g.interval, frames = g.frames;
    static app A;
    app *a = &A;
    memset(a, 0, sizeof *a);
    memset(&S, 0, sizeof S);
    a->att = &S;
    S.next_req = ATTACH_REQ_BASE;
    kv_config_default(&a->cfg);
    for (int i = 0; i < n_urls; i++) {
        kv_err err;
        S.src[i] = kv_source_new(urls[i], key, kind, (int)interval, &err);
        if (!S.src[i]) {
            fprintf(stderr, "kvtop attach: %s\n", err.msg);
            for (int k = 0; k < i; k++) kv_source_free(S.src[k]);
            return 2;
        }
        S.n_src++;
    }
    if (kv_events_open(&S, &g)) {
        attach_free_sources(&S);
        return 2;
    }
    if (kv_http_global_init()) {
        fprintf(stderr, "kvtop attach: libcurl did not start\n");
        attach_free_sources(&S);
        return 1;
    }
    a->max_frames = (uint64_t)frames;
    a->zoom = -1;
    a->v.phase = KV_PHASE_LOADING;
    a->v.template_name = "server's";
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "connecting to %.400s", urls[0]);
    snprintf(a->v.profile_path, sizeof a->v.profile_path, "%.250s", urls[0]);
    a->snap = kv_snapshot_new();
    int rc = 1;
    if (!a->snap) goto done;
    app_make_stamp(a, "attach-");
    if (kv_session_state_dir(a->state_dir, sizeof a->state_dir)) a->state_dir[0] = 0;
    for (int i = 0; i < S.n_src; i++)
        if (kv_source_start(S.src[i])) {
            fprintf(stderr, "kvtop attach: cannot start a thread\n");
            goto done;
        }
    if (app_curses_start(a)) goto done;
    if (kv_input_init(commands_on_line, a)) {
        endwin();
        fprintf(stderr, "kvtop attach: readline did not start\n");
        goto done;
    }
    kv_session *first = chat_session_add(a, NULL);
    if (first) {
        kv_input_history_free(first->history);
        first->history = NULL;
    }
    double t0 = app_wall_s();
    app_loop(a, attach_key, attach_frame);
    endwin();
    kv_input_shutdown();
    report(&S, app_wall_s() - t0);
    rc = 0;
done:
    attach_free(a);
    kv_http_global_cleanup();
    return rc;
}
