/* server.h - the entry point of kvtop serve, the OpenAI-compatible HTTP
 * front end (server/). The only header of server/ that another front end
 * includes: it names no library header. */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include <stddef.h>

/* `kvtop serve [PROFILE] [--set k=v ...] [--host H] [--port P] [--api-key
 * KEY] ...`: loads the profile, listens, loads the model (answering 503
 * meanwhile), serves until SIGINT/SIGTERM, then stops accepting, lets
 * in-flight requests finish for server.shutdown_grace_ms, cancels the rest
 * and returns. argv[0] is "serve". Returns the exit status: 0 after a
 * signal, 1 on a runtime error (cannot listen, model failed), 2 on a usage
 * or profile error. */
int cmd_serve(int argc, char **argv);

/* ---- serving an engine another front end owns (`kvtop PROFILE --serve PORT`) ---- */

struct kv_engine;
struct kv_config;
struct kv_event;
typedef struct kv_server kv_server;

/* Serves e (started, borrowed: it must outlive the server) over HTTP with
 * cfg's server section (cfg copied); port >= 0 overrides server.port (0:
 * any free port). The key comes from server.api_key, else KVTOP_API_KEY.
 * From here on the server's dispatcher is the engine's one event reader:
 * the caller reads the events of its own requests with kv_server_poll,
 * never with kv_engine_poll. Returns NULL with err (cap bytes) filled when
 * it cannot listen. */
kv_server *kv_server_start(struct kv_engine *e, const struct kv_config *cfg, int port, char *err /* OUT: (cap) */,
                           size_t cap);
/* The port it listens on. */
int kv_server_port(const kv_server *s);
/* Up to cap events of requests that are not the server's (oldest first);
 * never blocks. Returns how many. */
int kv_server_poll(kv_server *s, struct kv_event *out /* OUT: (cap) */, int cap);
/* Stops accepting, cancels the server's requests (their clients get an
 * error event), closes every connection and frees s; the engine goes on
 * (its later events are kv_engine_poll's again; foreign events not yet
 * taken with kv_server_poll are dropped, so take them first). NULL is a
 * no-op. */
void kv_server_stop(kv_server *s);

/* The four calls above as a table: the dispatcher (cli/main.c) hands it to
 * the TUI (tui/tui.h), so tui/ calls the server without linking server/. */
typedef struct kv_server_ops {
    kv_server *(*start)(struct kv_engine *e, const struct kv_config *cfg, int port, char *err, size_t cap);
    int (*port)(const kv_server *s);
    int (*poll)(kv_server *s, struct kv_event *out, int cap);
    void (*stop)(kv_server *s);
} kv_server_ops;
extern const kv_server_ops kv_server_api;

#endif
