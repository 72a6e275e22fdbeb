/* kv_events_sub.c - the KV-event subscriber thread (see kv_events_sub.h).
 * Bounded: the socket queues at most SUB_HWM messages of at most
 * SUB_MAX_MSG bytes (libzmq drops bigger ones and the connection), every
 * receive times out after 100 ms so stopping is prompt, libzmq reconnects
 * on its own (100 ms, backing off to 5 s), and a replay request waits at
 * most REPLAY_WAIT_MS. */
#include "kv_events_sub.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KV_HAVE_ZMQ
#include <zmq.h>
#endif

#define SUB_HWM 10000
#define SUB_MAX_MSG (16 << 20)
#define REPLAY_WAIT_MS 2000
#define SUMMARY_EVERY_S 0.2

int kv_kvsub_check_endpoint(const char *s, kv_err *err) {
    const char *p = s && !strncmp(s, "tcp://", 6) ? s + 6 : NULL;
    const char *colon = p ? strrchr(p, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!p || !colon || colon == p || !colon[1] || *end || port < 1 || port > 65535 || strchr(p, '*') ||
        strlen(s) >= 256)
        return kv_err_set(err, KV_ERR_INVAL, "a KV-event endpoint is tcp://HOST:PORT, got '%.200s'", s ? s : "");
    return 0;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct kv_kvsub {
    char endpoint[256], replay[256];
    pthread_t thread;
    int started;
    atomic_int stop;
    pthread_mutex_t mu;        /* guards view, view_seq, st */
    kv_ptree_view view;
    uint64_t view_seq;
    kv_kvsub_status st;
    double last_msg;           /* monotonic; 0 none (under mu) */
    /* the thread's own */
    kv_ptree tree;
    int dirty;
    double last_sum;
    void *ctx, *sub, *dealer;
};

#ifdef KV_HAVE_ZMQ
int kv_kvsub_available(void) { return 1; }
#else
int kv_kvsub_available(void) { return 0; }
#endif

kv_kvsub *kv_kvsub_new(const char *endpoint, const char *replay, uint32_t max_nodes, kv_err *err) {
    if (kv_kvsub_check_endpoint(endpoint, err)) return NULL;
    if (replay && kv_kvsub_check_endpoint(replay, err)) return NULL;
    if (!kv_kvsub_available()) {
        kv_err_set(err, KV_ERR_UNSUPPORTED,
                   "--kv-events needs libzmq, and this kvtop was built without it (apt-get install libzmq3-dev, "
                   "then make)");
        return NULL;
    }
    kv_kvsub *s = calloc(1, sizeof *s);
    if (!s) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (kv_ptree_init(&s->tree, max_nodes, err)) {
        free(s);
        return NULL;
    }
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    if (replay) snprintf(s->replay, sizeof s->replay, "%s", replay);
    snprintf(s->st.endpoint, sizeof s->st.endpoint, "%s", endpoint);
    pthread_mutex_init(&s->mu, NULL);
    kv_ptree_summarize(&s->tree, &s->view);
    return s;
}

int kv_kvsub_take(kv_kvsub *s, kv_ptree_view *out, uint64_t *seq, kv_kvsub_status *st) {
    int got = 0;
    pthread_mutex_lock(&s->mu);
    if (out && s->view_seq != *seq) {
        *out = s->view;
        *seq = s->view_seq;
        got = 1;
    }
    if (st) {
        *st = s->st;
        st->since_last_s = s->last_msg > 0 ? mono_s() - s->last_msg : -1;
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

#ifdef KV_HAVE_ZMQ

static void set_error(kv_kvsub *s, const char *fmt, const char *what) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->st.error, sizeof s->st.error, fmt, what);
    pthread_mutex_unlock(&s->mu);
}

/* Publishes a fresh summary when the tree changed (at most every 0.2 s
 * unless force). */
static void publish(kv_kvsub *s, int force) {
    double now = mono_s();
    if (!s->dirty || (!force && now - s->last_sum < SUMMARY_EVERY_S)) return;
    kv_ptree_view *v = malloc(sizeof *v);
    if (!v) return; /* try again at the next message */
    kv_ptree_summarize(&s->tree, v);
    pthread_mutex_lock(&s->mu);
    s->view = *v;
    s->view_seq++;
    pthread_mutex_unlock(&s->mu);
    free(v);
    s->dirty = 0;
    s->last_sum = now;
}

/* Receives one multipart message into frames (at most 3 kept, the rest
 * counted in *n_parts). 0, or -1 on timeout/stop. */
static int recv_parts(void *sock, zmq_msg_t *frames, int *n_parts) {
    *n_parts = 0;
    for (int tries = 0;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            /* the parts of a message arrive together: only a signal (or
             * a timeout before the first) interrupts */
            if (*n_parts == 0 || ++tries > 10) return *n_parts ? 0 : -1;
            continue;
        }
        int more = zmq_msg_more(&m);
        if (*n_parts < 3) frames[*n_parts] = m;
        else zmq_msg_close(&m);
        (*n_parts)++;
        if (!more) return 0;
    }
}

static void close_parts(zmq_msg_t *frames, int n) {
    for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&frames[i]);
}

static int64_t seq_of(zmq_msg_t *f) {
    const uint8_t *p = zmq_msg_data(f);
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = (x << 8) | p[i];
    return (int64_t)x;
}

/* Applies one batch of sequence seq (the caller checked the order). */
static void apply(kv_kvsub *s, int64_t seq, const void *payload, size_t n) {
    kv_ptree_seq(&s->tree, seq);
    kv_err err;
    if (kv_ptree_apply(&s->tree, payload, n, &err)) set_error(s, "%.159s", err.msg);
    s->dirty = 1;
    pthread_mutex_lock(&s->mu);
    s->st.have_batch = 1;
    pthread_mutex_unlock(&s->mu);
}

static void count(kv_kvsub *s, uint64_t *field) {
    pthread_mutex_lock(&s->mu);
    (*field)++;
    pthread_mutex_unlock(&s->mu);
}

/* Asks the replay socket for every batch from `from` on and applies those
 * after the last one applied, up to its end marker (sequence -1). 0, or
 * -1 when no answer came in time. */
static int replay_from(kv_kvsub *s, int64_t from) {
    if (!s->dealer) return -1;
    uint8_t be8[8];
    for (int i = 0; i < 8; i++) be8[i] = (uint8_t)((uint64_t)from >> (56 - 8 * i));
    count(s, &s->st.replays);
    if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(s->dealer, be8, 8, ZMQ_DONTWAIT) < 0) {
        count(s, &s->st.replay_failed);
        return -1;
    }
    double until = mono_s() + REPLAY_WAIT_MS / 1000.0;
    while (!atomic_load(&s->stop) && mono_s() < until) {
        zmq_msg_t f[3];
        int np;
        if (recv_parts(s->dealer, f, &np)) continue;
        /* [empty delimiter, seq, payload] */
        if (np != 3 || zmq_msg_size(&f[1]) != 8) {
            close_parts(f, np);
            count(s, &s->st.bad_frames);
            continue;
        }
        int64_t seq = seq_of(&f[1]);
        if (seq == -1) {
            close_parts(f, np);
            return 0;
        }
        if (seq > s->tree.c.last_seq) {
            apply(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            count(s, &s->st.replayed);
        }
        close_parts(f, np);
    }
    count(s, &s->st.replay_failed);
    return -1;
}

/* One message from the PUB socket. */
static void on_message(kv_kvsub *s, zmq_msg_t *f, int np) {
    pthread_mutex_lock(&s->mu);
    s->last_msg = mono_s();
    pthread_mutex_unlock(&s->mu);
    if (np != 3 || zmq_msg_size(&f[1]) != 8) {
        count(s, &s->st.bad_frames);
        return;
    }
    int64_t seq = seq_of(&f[1]), last = s->tree.c.last_seq;
    if (last >= 0 && seq <= last) {
        if (seq != 0) {
            count(s, &s->st.duplicates);
            return;
        }
        kv_ptree_clear(&s->tree); /* a new publisher: its cache starts empty */
        s->tree.c.last_seq = -1;
        count(s, &s->st.restarts);
    } else if (last >= 0 && seq > last + 1 && replay_from(s, last + 1) == 0 && s->tree.c.last_seq >= seq) {
        return; /* the replay brought this one too */
    }
    apply(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
}

static void *sub_main(void *arg) {
    kv_kvsub *s = arg;
    int first = 1;
    while (!atomic_load(&s->stop)) {
        zmq_msg_t f[3];
        int np;
        if (first && s->dealer) { /* what the publisher still holds from before we came */
            replay_from(s, 0);
            first = 0;
        }
        if (recv_parts(s->sub, f, &np) == 0) {
            on_message(s, f, np);
            close_parts(f, np);
        }
        publish(s, 0);
    }
    publish(s, 1);
    return NULL;
}

static int opt_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

static int open_sockets(kv_kvsub *s) {
    int64_t max = SUB_MAX_MSG;
    s->ctx = zmq_ctx_new();
    if (!s->ctx) return -1;
    s->sub = zmq_socket(s->ctx, ZMQ_SUB);
    if (!s->sub || zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, "", 0) || opt_int(s->sub, ZMQ_RCVTIMEO, 100) ||
        opt_int(s->sub, ZMQ_RCVHWM, SUB_HWM) || opt_int(s->sub, ZMQ_LINGER, 0) ||
        opt_int(s->sub, ZMQ_RECONNECT_IVL, 100) || opt_int(s->sub, ZMQ_RECONNECT_IVL_MAX, 5000) ||
        zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &max, sizeof max) || zmq_connect(s->sub, s->endpoint))
        return -1;
    if (s->replay[0]) {
        s->dealer = zmq_socket(s->ctx, ZMQ_DEALER);
        if (!s->dealer || opt_int(s->dealer, ZMQ_RCVTIMEO, 100) || opt_int(s->dealer, ZMQ_LINGER, 0) ||
            opt_int(s->dealer, ZMQ_SNDTIMEO, 100) || zmq_setsockopt(s->dealer, ZMQ_MAXMSGSIZE, &max, sizeof max) ||
            zmq_connect(s->dealer, s->replay))
            return -1;
    }
    return 0;
}

static void close_sockets(kv_kvsub *s) {
    if (s->sub) zmq_close(s->sub);
    if (s->dealer) zmq_close(s->dealer);
    if (s->ctx) zmq_ctx_term(s->ctx);
    s->sub = s->dealer = s->ctx = NULL;
}

int kv_kvsub_start(kv_kvsub *s) {
    if (open_sockets(s)) {
        set_error(s, "cannot subscribe: %s", zmq_strerror(errno));
        close_sockets(s);
        return KV_ERR_IO;
    }
    if (pthread_create(&s->thread, NULL, sub_main, s)) {
        close_sockets(s);
        return KV_ERR_IO;
    }
    s->started = 1;
    return 0;
}

#else

int kv_kvsub_start(kv_kvsub *s) {
    (void)s;
    return KV_ERR_IO;
}

static void close_sockets(kv_kvsub *s) { (void)s; }

#endif

void kv_kvsub_free(kv_kvsub *s) {
    if (!s) return;
    if (s->started) {
        atomic_store(&s->stop, 1);
        pthread_join(s->thread, NULL);
    }
    close_sockets(s);
    kv_ptree_free(&s->tree);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
