/* test_http.c - the HTTP layer with no model: while the model loads every
 * route but /health answers 503 (and /health says "loading"), a failed load
 * says why, unknown routes are 404, wrong methods 405 with Allow, bodies
 * above server.max_body 413 (after reading them, so the client sees the
 * reply), a missing key 401, and a client that never finishes its headers
 * is dropped at server.header_timeout_ms. Loopback, port 0. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../harness.h"
#include "../../server/http.h"

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends one request (Connection: close) and returns the status; the
 * response (cut to cap) goes to out. */
static int request(int port, const char *method, const char *path, const char *headers, const char *body,
                   size_t body_len, char *out, size_t cap) {
    int fd = connect_to(port);
    if (fd < 0) return -1;
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n%s\r\n",
                     method, path, body_len, headers ? headers : "");
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n) goto fail;
    for (size_t at = 0; at < body_len;) {
        ssize_t w = send(fd, body + at, body_len - at, MSG_NOSIGNAL);
        if (w <= 0) goto fail;
        at += (size_t)w;
    }
    size_t got = 0;
    for (;;) {
        char buf[4096];
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) break;
        size_t k = KV_MIN((size_t)r, cap - 1 - got);
        memcpy(out + got, buf, k);
        got += k;
    }
    out[got] = 0;
    close(fd);
    int status = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) return -1;
    return status;
fail:
    close(fd);
    return -1;
}

static srv *make_server(void) {
    srv *s = calloc(1, sizeof *s);
    kv_config_default(&s->cfg);
    s->cfg.server.port = 0;
    s->cfg.server.max_body = 4096;
    s->cfg.server.header_timeout_ms = 500;
    s->cfg.server.idle_timeout_ms = 5000;
    kv_copy_str(s->model_id, sizeof s->model_id, "m");
    atomic_store(&s->state, SRV_LOADING);
    kv_err err;
    if (srv_http_start(s, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        free(s);
        return NULL;
    }
    return s;
}

static void test_loading_and_routes(void) {
    srv *s = make_server();
    REQUIRE(s);
    int port = srv_http_port(s);
    REQUIRE(port > 0);
    static char out[65536];
    CHECK(request(port, "GET", "/health", NULL, "", 0, out, sizeof out) == 503 && strstr(out, "\"loading\""));
    const char *b = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    CHECK(request(port, "POST", "/v1/chat/completions", NULL, b, strlen(b), out, sizeof out) == 503 &&
          strstr(out, "\"model_loading\"") && strstr(out, "Retry-After: 1"));
    CHECK(request(port, "GET", "/v1/models", NULL, "", 0, out, sizeof out) == 503);
    CHECK(request(port, "GET", "/metrics", NULL, "", 0, out, sizeof out) == 503);
    CHECK(request(port, "GET", "/v1/nope", NULL, "", 0, out, sizeof out) == 404 &&
          strstr(out, "{\"error\":{\"message\":") && strstr(out, "\"type\":\"invalid_request_error\""));
    CHECK(request(port, "DELETE", "/v1/completions", NULL, "", 0, out, sizeof out) == 405 && strstr(out, "Allow: POST"));
    CHECK(request(port, "POST", "/health", NULL, "", 0, out, sizeof out) == 405 && strstr(out, "Allow: GET, HEAD"));
    /* a body over max_body is read to its end and answered 413 */
    static char big[100000];
    memset(big, 'x', sizeof big);
    CHECK(request(port, "POST", "/v1/completions", NULL, big, sizeof big, out, sizeof out) == 413 &&
          strstr(out, "request_too_large"));
    /* a failed load says why */
    kv_copy_str(s->load_error, sizeof s->load_error, "model.path: no such file");
    atomic_store(&s->state, SRV_FAILED);
    CHECK(request(port, "GET", "/health", NULL, "", 0, out, sizeof out) == 503 && strstr(out, "no such file"));
    CHECK(request(port, "GET", "/v1/models", NULL, "", 0, out, sizeof out) == 503 && strstr(out, "no such file"));
    srv_http_stop(s);
    free(s);
}

static void test_key_and_control(void) {
    srv *s = make_server();
    REQUIRE(s);
    kv_copy_str(s->api_key, sizeof s->api_key, "sekrit");
    int port = srv_http_port(s);
    static char out[65536];
    CHECK(request(port, "GET", "/v1/models", NULL, "", 0, out, sizeof out) == 401 && strstr(out, "invalid_api_key"));
    CHECK(request(port, "GET", "/v1/models", "Authorization: Bearer nope\r\n", "", 0, out, sizeof out) == 401);
    /* with the key it goes on to the state check */
    CHECK(request(port, "GET", "/v1/models", "Authorization: Bearer sekrit\r\n", "", 0, out, sizeof out) == 503);
    CHECK(request(port, "GET", "/health", NULL, "", 0, out, sizeof out) == 503); /* open, says loading */
    s->cfg.server.auth_health = 1;
    CHECK(request(port, "GET", "/health", NULL, "", 0, out, sizeof out) == 401);
    s->api_key[0] = 0;
    CHECK(request(port, "POST", "/kvtop/v1/control", NULL, "{}", 2, out, sizeof out) == 403);
    srv_http_stop(s);
    free(s);
}

static void test_slow_headers_dropped(void) {
    srv *s = make_server();
    REQUIRE(s);
    int port = srv_http_port(s);
    int fd = connect_to(port);
    REQUIRE(fd >= 0);
    const char *part = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    CHECK(send(fd, part, strlen(part), MSG_NOSIGNAL) == (ssize_t)strlen(part));
    /* keep it busy (never idle) but never finish: the header deadline ends it */
    double t0 = kv_now_s();
    int closed = 0;
    while (kv_now_s() - t0 < 3 && !closed) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) closed = 1;
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        if (r == 0) closed = 1;
    }
    double dt = kv_now_s() - t0;
    CHECKF(closed && dt < 1.5, "closed %d after %.2f s", closed, dt);
    close(fd);
    /* meanwhile and after, others are served */
    static char out[4096];
    CHECK(request(port, "GET", "/health", NULL, "", 0, out, sizeof out) == 503);
    srv_http_stop(s);
    free(s);
}

TEST_MAIN(T(test_loading_and_routes), T(test_key_and_control), T(test_slow_headers_dropped))
