/* http.c - libmicrohttpd glue: one route table, bounded request bodies,
 * the API key, responses from srv_reply, Server-Sent Events from
 * srv_stream, and a watchdog that drops slow clients.
 *
 * NOTE: threading. The daemon runs a thread per connection (bounded by
 * server.max_connections) rather than one polling thread with
 * suspend/resume: a streaming reply blocks in its content reader on its
 * job's condition variable and wakes on each token, and a non-streaming
 * one blocks in the access handler until its job is done; both check
 * their socket while they wait (a peek sees the client's FIN), so a client
 * that goes away is cancelled at the next token or within 200 ms while
 * queued. With suspend/resume the reader could not block, every token
 * would need a resume from the dispatcher, and a suspended connection's
 * disconnect goes unseen. A thread that waits in a socket read costs its
 * stack and nothing else: the watchdog, not a worker, bounds how long a
 * client may take to send its request (server.header_timeout_ms, counted
 * from the connection or the previous reply), and libmicrohttpd's idle
 * timeout drops silent ones. Engine work never runs on these threads. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_MS 200          /* a blocked reply looks at its socket this often */
#define DRAIN_CAP (64ull << 20)    /* a body above max_body is read and dropped up to this, then cut */
#define STACK_BYTES (1u << 20)     /* per connection thread */
#define WATCH_MS 10                /* the watchdog looks at busy sockets this often */
#define WATCH_MAX 4096             /* busy sockets it watches at once */

typedef struct conn_rec {
    struct conn_rec *prev, *next;
    int fd;
    uint64_t deadline_ms;          /* monotonic; 0 = none (a request is being served) */
    srv_stream *active;            /* a reply being generated for it (watched for the client leaving), or NULL */
} conn_rec;

struct srv_http {
    struct MHD_Daemon *d;
    srv *s;
    int port;
    pthread_mutex_t mu;            /* the connection list */
    conn_rec *conns;
    int n_conns;
    pthread_t watchdog;
    int wd_started, wd_stop;
    unsigned idle_s;               /* libmicrohttpd's timeout, seconds */
    int listen_fd;                 /* after quiesce: closed by us */
};

enum route_id {
    R_NONE = 0, R_HEALTH, R_METRICS, R_MODELS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE,
    R_SNAPSHOT, R_STREAM, R_CONTROL
};

typedef struct route {
    const char *path;
    const char *method;            /* "GET" (HEAD too) or "POST" */
    enum route_id id;
} route;

static const route routes[] = {
    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},
    {"/v1/models", "GET", R_MODELS},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},
    {"/kvtop/v1/snapshot", "GET", R_SNAPSHOT},
    {"/kvtop/v1/stream", "GET", R_STREAM},
    {"/kvtop/v1/control", "POST", R_CONTROL},
};

/* Per request (MHD's con_cls). */
typedef struct req_ctx {
    const route *rt;               /* NULL: unknown path */
    int method_ok;
    srv_buf body;
    int too_big;                   /* bool: the body passed max_body (drained, 413) */
    uint64_t seen_bytes;
    int fd;
    struct MHD_Connection *c;
    srv *s;
    srv_stream *stream;            /* a streaming reply, owned */
    srv_buf out;                   /* its bytes not yet handed to MHD */
    size_t out_off;
    int out_end;                   /* bool: the stream has ended */
    int gone;                      /* bool: the client went away */
} req_ctx;

static uint64_t mono_ms(void) { return kv_now_ns() / 1000000u; }

int srv_key_equal(const char *given, size_t given_len, const char *key) {
    size_t kl = strlen(key);
    unsigned char diff = (unsigned char)(given_len != kl);
    /* walk the presented key whole; compare against the key cyclically */
    for (size_t i = 0; i < given_len; i++) diff |= (unsigned char)(given[i] ^ (kl ? key[i % kl] : 0));
    return diff == 0 && kl > 0;
}

/* 1 when the peer closed its side (or the socket failed). */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

/* Restarts libmicrohttpd's idle timer after a long wait of ours (setting
 * the timeout from 0 resets it), so a reply that took longer than the idle
 * timeout to compute is still sent. */
static void touch(struct MHD_Connection *c, unsigned idle_s) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, idle_s);
}

/* ---- the connection list and the watchdog ---- */

static conn_rec *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void set_deadline(struct srv_http *h, conn_rec *cr, uint64_t deadline) {
    if (!cr) return;
    pthread_mutex_lock(&h->mu);
    cr->deadline_ms = deadline;
    pthread_mutex_unlock(&h->mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct srv_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_rec *cr = calloc(1, sizeof *cr);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!cr) return; /* not watched: libmicrohttpd's idle timeout still applies */
        cr->fd = ci ? ci->connect_fd : -1;
        if (cr->fd >= 0) {
            /* a peer that vanished without a FIN: keepalive probes and an
             * unacknowledged-data bound end the connection */
            int on = 1, idle = (int)KV_MAX(1u, h->idle_s / 2), intvl = 1, cnt = 3;
            unsigned int user_to = h->idle_s * 1000u;
            setsockopt(cr->fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
            setsockopt(cr->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
            setsockopt(cr->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
            setsockopt(cr->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
            setsockopt(cr->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_to, sizeof user_to);
        }
        cr->deadline_ms = mono_ms() + (uint64_t)h->s->cfg.server.header_timeout_ms;
        pthread_mutex_lock(&h->mu);
        cr->next = h->conns;
        if (h->conns) h->conns->prev = cr;
        h->conns = cr;
        h->n_conns++;
        pthread_mutex_unlock(&h->mu);
        *socket_context = cr;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        /* called before libmicrohttpd closes the socket: once the record is
         * gone the watchdog cannot touch a reused descriptor */
        conn_rec *cr = *socket_context;
        if (!cr) return;
        pthread_mutex_lock(&h->mu);
        if (cr->prev) cr->prev->next = cr->next;
        else h->conns = cr->next;
        if (cr->next) cr->next->prev = cr->prev;
        h->n_conns--;
        pthread_mutex_unlock(&h->mu);
        free(cr);
        *socket_context = NULL;
    }
}

/* Marks the reply a connection is generating (NULL: none), so the
 * watchdog can cancel it the moment its client leaves. */
static void set_active(struct srv_http *h, conn_rec *cr, srv_stream *st) {
    if (!cr) return;
    pthread_mutex_lock(&h->mu);
    cr->active = st;
    pthread_mutex_unlock(&h->mu);
}

/* The watchdog: connections past their deadline are shut down (their
 * thread sees end-of-file and closes them); a connection generating a
 * reply whose client hung up (POLLRDHUP: its FIN, or a reset) has its
 * requests cancelled at once, within the engine step running now rather
 * than at its next token. */
static void *watchdog_main(void *arg) {
    struct srv_http *h = arg;
    struct pollfd *pf = malloc(WATCH_MAX * sizeof *pf);
    conn_rec **who = malloc(WATCH_MAX * sizeof *who);
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&h->mu);
        if (h->wd_stop) {
            pthread_mutex_unlock(&h->mu);
            break;
        }
        uint64_t now = mono_ms();
        for (conn_rec *cr = h->conns; cr; cr = cr->next) {
            if (cr->deadline_ms && now > cr->deadline_ms && cr->fd >= 0) {
                shutdown(cr->fd, SHUT_RDWR);
                cr->deadline_ms = 0;
            }
            if (cr->active && cr->fd >= 0 && pf && who && n < WATCH_MAX) {
                pf[n] = (struct pollfd){.fd = cr->fd, .events = POLLRDHUP};
                who[n++] = cr;
            }
        }
        pthread_mutex_unlock(&h->mu);
        if (n == 0 || poll(pf, (nfds_t)n, WATCH_MS) <= 0) {
            if (n == 0) {
                struct timespec ts = {0, WATCH_MS * 1000000L};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        pthread_mutex_lock(&h->mu);
        for (int i = 0; i < n; i++) {
            if (!(pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            /* the record is still listed (its connection open) and still busy */
            for (conn_rec *cr = h->conns; cr; cr = cr->next)
                if (cr == who[i] && cr->active && cr->fd == pf[i].fd) {
                    if (cr->active->cancel) cr->active->cancel(cr->active);
                    cr->active = NULL;
                }
        }
        pthread_mutex_unlock(&h->mu);
    }
    free(pf);
    free(who);
    return NULL;
}

/* ---- replies ---- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    req_ctx *rc = cls;
    unsigned idle_s = rc->s->http->idle_s;
    for (;;) {
        if (rc->out_off < rc->out.n) {
            size_t n = KV_MIN(max, rc->out.n - rc->out_off);
            memcpy(buf, rc->out.p + rc->out_off, n);
            rc->out_off += n;
            if (rc->out_off == rc->out.n) rc->out_off = rc->out.n = 0;
            touch(rc->c, idle_s);
            return (ssize_t)n;
        }
        if (rc->out_end) return MHD_CONTENT_READER_END_OF_STREAM;
        if (peer_gone(rc->fd)) {
            rc->gone = 1;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (srv_stream_next(rc->stream, &rc->out, WAIT_SLICE_MS) < 0) rc->out_end = 1;
    }
}

static enum MHD_Result send_reply(req_ctx *rc, srv_reply *r, const char *allow) {
    struct MHD_Response *resp;
    if (r->stream) {
        rc->stream = r->stream;
        set_active(rc->s->http, conn_of(rc->c), r->stream);
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, rc, NULL);
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
        if (!resp) free(r->body);
    }
    r->body = NULL;
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "text/plain");
    if (r->stream) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    }
    if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result ret = MHD_queue_response(rc->c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    if (rc->s->hub) srv_hub_count_http(rc->s->hub, r->status);
    return ret;
}

static enum MHD_Result send_error(req_ctx *rc, int status, const char *type, const char *code, const char *allow,
                                  const char *fmt, const char *arg) {
    srv_error e;
    srv_fail(&e, status, type, NULL, code, fmt, arg);
    srv_reply r = {0};
    srv_reply_error(&r, &e);
    return send_reply(rc, &r, allow);
}

/* ---- the request ---- */

static int authorized(const srv *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7;
    while (*k == ' ') k++;
    return srv_key_equal(k, strlen(k), s->api_key);
}

static int query_int(struct MHD_Connection *c, const char *name, int lo, int hi, int *out) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) return -1;
    *out = (int)x;
    return 0;
}

/* Runs the route (state, auth and limits already checked). */
static enum MHD_Result dispatch(req_ctx *rc) {
    srv *s = rc->s;
    srv_reply r = {0};
    const char *b = rc->body.p ? rc->body.p : "";
    size_t bl = rc->body.n;
    switch (rc->rt->id) {
    case R_HEALTH: srv_handle_health(s, &r); break;
    case R_METRICS: srv_handle_metrics(s, &r); break;
    case R_MODELS: srv_handle_models(s, &r); break;
    case R_CHAT: srv_handle_gen(s, SRV_CHAT, b, bl, &r); break;
    case R_COMPLETIONS: srv_handle_gen(s, SRV_COMPLETION, b, bl, &r); break;
    case R_TOKENIZE: srv_handle_tokenize(s, b, bl, &r); break;
    case R_DETOKENIZE: srv_handle_detokenize(s, b, bl, &r); break;
    case R_SNAPSHOT: {
        int check = 0;
        if (query_int(rc->c, "check", 0, 1, &check))
            return send_error(rc, 400, "invalid_request_error", "invalid_value", NULL, "%s", "check must be 0 or 1");
        srv_handle_snapshot(s, check, &r);
        break;
    }
    case R_STREAM: {
        int interval = -1, frames = -1;
        if (query_int(rc->c, "interval_ms", 0, 3600000, &interval) ||
            query_int(rc->c, "max_frames", 0, 1000000000, &frames))
            return send_error(rc, 400, "invalid_request_error", "invalid_value", NULL, "%s",
                              "interval_ms must be in [0, 3600000] and max_frames in [0, 1000000000]");
        srv_handle_stream(s, interval, frames, &r);
        break;
    }
    case R_CONTROL: srv_handle_control(s, b, bl, &r); break;
    default: return MHD_NO;
    }
    if (r.pending) {
        srv_stream *p = r.pending;
        conn_rec *cr = conn_of(rc->c);
        r.pending = NULL;
        set_active(s->http, cr, p);
        while (!srv_stream_wait(p, &r, WAIT_SLICE_MS))
            if (peer_gone(rc->fd)) {
                set_active(s->http, cr, NULL);
                srv_stream_free(p, 1);
                return MHD_NO; /* closes the connection */
            }
        set_active(s->http, cr, NULL);
        srv_stream_free(p, 0);
        touch(rc->c, s->http->idle_s);
    }
    return send_reply(rc, &r, NULL);
}

/* The last call for a request, its body complete. */
static enum MHD_Result finish_request(req_ctx *rc, const char *method, const char *url) {
    srv *s = rc->s;
    if (!rc->rt) return send_error(rc, 404, "invalid_request_error", "not_found", NULL, "no such route: %s", url);
    if (!rc->method_ok) {
        char allow[16];
        snprintf(allow, sizeof allow, "%s", !strcmp(rc->rt->method, "GET") ? "GET, HEAD" : "POST");
        return send_error(rc, 405, "invalid_request_error", "method_not_allowed", allow,
                          "method not allowed; this route takes %s", allow);
    }
    int needs_key = s->api_key[0] != 0;
    if (rc->rt->id == R_HEALTH) needs_key &= s->cfg.server.auth_health;
    if (rc->rt->id == R_METRICS) needs_key &= s->cfg.server.auth_metrics;
    if (rc->rt->id == R_CONTROL && !s->api_key[0])
        return send_error(rc, 403, "permission_error", "no_api_key", NULL, "%s",
                          "/kvtop/v1/control needs an API key: start the server with --api-key or server.api_key");
    if (needs_key && !authorized(s, rc->c))
        return send_error(rc, 401, "authentication_error", "invalid_api_key", NULL, "%s",
                          "a valid API key is required (Authorization: Bearer KEY)");
    if (rc->too_big) {
        char lim[64];
        snprintf(lim, sizeof lim, "%llu", (unsigned long long)s->cfg.server.max_body);
        return send_error(rc, 413, "invalid_request_error", "request_too_large", NULL,
                          "the request body is larger than server.max_body (%s bytes)", lim);
    }
    int st = atomic_load(&s->state);
    if (rc->rt->id != R_HEALTH && st != SRV_READY && st != SRV_STOPPING)
        return send_error(rc, 503, "service_unavailable", st == SRV_LOADING ? "model_loading" : "model_failed", NULL,
                          "%s", st == SRV_LOADING ? "the model is loading" : s->load_error);
    return dispatch(rc);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    req_ctx *rc = *con_cls;
    if (!rc) { /* the headers are in */
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *con_cls = rc;
        rc->s = s;
        rc->c = c;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        rc->fd = ci ? ci->connect_fd : -1;
        for (size_t i = 0; i < KV_ARRAY_LEN(routes); i++)
            if (!strcmp(url, routes[i].path)) rc->rt = &routes[i];
        if (rc->rt)
            rc->method_ok = !strcmp(method, rc->rt->method) ||
                            (!strcmp(rc->rt->method, "GET") && !strcmp(method, MHD_HTTP_METHOD_HEAD));
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > DRAIN_CAP) { /* not worth reading: answer now and close */
            rc->too_big = 1;
            set_deadline(s->http, conn_of(c), 0);
            return finish_request(rc, method, url);
        }
        rc->too_big = declared > s->cfg.server.max_body; /* read and dropped, never stored */
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        rc->seen_bytes += n;
        if (!rc->too_big && (rc->body.n + n > s->cfg.server.max_body || srv_buf_add(&rc->body, upload, n))) {
            rc->too_big = 1;
            srv_buf_free(&rc->body);
        }
        if (rc->too_big && rc->seen_bytes > DRAIN_CAP) return MHD_NO;
        return MHD_YES;
    }
    if (rc->stream || rc->out_end) return MHD_YES; /* already answered */
    set_deadline(s->http, conn_of(c), 0);
    return finish_request(rc, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    req_ctx *rc = *con_cls;
    if (rc) {
        if (rc->stream) set_active(s->http, conn_of(c), NULL);
        srv_stream_free(rc->stream, rc->gone || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
        srv_buf_free(&rc->body);
        srv_buf_free(&rc->out);
        free(rc);
        *con_cls = NULL;
    }
    /* the next request on this connection has the idle and header timeouts to arrive */
    set_deadline(s->http, conn_of(c),
                 mono_ms() + (uint64_t)s->cfg.server.idle_timeout_ms + (uint64_t)s->cfg.server.header_timeout_ms);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    (void)fmt;
    (void)ap; /* libmicrohttpd's notes on bad clients: the clients get their error replies */
}

/* ---- start and stop ---- */

int srv_http_start(srv *s, kv_err *err) {
    struct srv_http *h = calloc(1, sizeof *h);
    if (!h) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    h->s = s;
    h->listen_fd = -1;
    pthread_mutex_init(&h->mu, NULL);
    h->idle_s = (unsigned)((s->cfg.server.idle_timeout_ms + 999) / 1000);
    if (h->idle_s < 1) h->idle_s = 1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.server.port);
    int gai = getaddrinfo(s->cfg.server.host, port, &hints, &ai);
    if (gai || !ai) {
        kv_err_set(err, KV_ERR_INVAL, "server.host: cannot resolve '%s': %s", s->cfg.server.host, gai_strerror(gai));
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->http = h;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.server.max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, h->idle_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)STACK_BYTES,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        s->http = NULL;
        kv_err_set(err, KV_ERR_IO, "cannot listen on %s:%d: %s", s->cfg.server.host, s->cfg.server.port,
                   errno ? strerror(errno) : "libmicrohttpd failed to start");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : s->cfg.server.port;
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) == 0) h->wd_started = 1;
    return 0;
fail:
    pthread_mutex_destroy(&h->mu);
    free(h);
    return err ? err->code : KV_ERR_IO;
}

int srv_http_port(const srv *s) { return s->http ? s->http->port : 0; }

int srv_http_connections(const srv *s) {
    if (!s->http) return 0;
    pthread_mutex_lock(&s->http->mu);
    int n = s->http->n_conns;
    pthread_mutex_unlock(&s->http->mu);
    return n;
}

void srv_http_quiesce(srv *s) {
    if (!s->http || !s->http->d || s->http->listen_fd >= 0) return;
    MHD_socket fd = MHD_quiesce_daemon(s->http->d);
    if (fd != MHD_INVALID_SOCKET) {
        close(fd);
        s->http->listen_fd = 0;
    }
}

void srv_http_stop(srv *s) {
    struct srv_http *h = s ? s->http : NULL;
    if (!h) return;
    if (h->wd_started) {
        pthread_mutex_lock(&h->mu);
        h->wd_stop = 1;
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->watchdog, NULL);
    }
    if (h->d) MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    s->http = NULL;
    free(h);
}
