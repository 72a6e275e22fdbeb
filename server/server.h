/* server.h - the entry point of kvtop serve, the OpenAI-compatible HTTP
 * front end (server/). The only header of server/ that another front end
 * includes: it names no library header. */
#ifndef KV_SERVER_H
#define KV_SERVER_H

/* `kvtop serve [PROFILE] [--set k=v ...] [--host H] [--port P] [--api-key
 * KEY] ...`: loads the profile, listens, loads the model (answering 503
 * meanwhile), serves until SIGINT/SIGTERM, then stops accepting, lets
 * in-flight requests finish for server.shutdown_grace_ms, cancels the rest
 * and returns. argv[0] is "serve". Returns the exit status: 0 after a
 * signal, 1 on a runtime error (cannot listen, model failed), 2 on a usage
 * or profile error. */
int cmd_serve(int argc, char **argv);

#endif
