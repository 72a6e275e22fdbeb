/* http.h - the HTTP front of kvtop serve on libmicrohttpd: routes, the API
 * key, body and connection limits, header/idle timeouts, disconnect
 * detection, and the start/stop of the daemon. The header needs nothing of
 * libmicrohttpd. */
#ifndef KV_SRV_HTTP_H
#define KV_SRV_HTTP_H

#include "srv.h"

/* Starts listening on s->cfg.server.host:port (port 0: any free one) with
 * s's limits; requests that need the engine answer 503 until s->state is
 * SRV_READY. Returns 0 (s->http set) or a negative KV_ERR_* with err
 * naming the address. */
int srv_http_start(srv *s, kv_err *err);
/* The port the server listens on (the one chosen for port 0). */
int srv_http_port(const srv *s);
/* Stops accepting new connections (open ones go on). */
void srv_http_quiesce(srv *s);
/* Open connections now. */
int srv_http_connections(const srv *s);
/* Closes every connection, stops the daemon and frees s->http. NULL-safe. */
void srv_http_stop(srv *s);

/* Constant-time comparison of a presented key with the server's: the time
 * taken does not depend on where they differ (nor on the presented key's
 * length beyond reading it). Returns 1 when equal. */
int srv_key_equal(const char *given, size_t given_len, const char *key);

#endif
