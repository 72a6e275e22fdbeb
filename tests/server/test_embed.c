/* test_embed.c - the server on an engine another front end owns (what
 * `kvtop PROFILE --serve PORT` does), on stories260K: HTTP requests are
 * served while the owner's own requests keep flowing to it through
 * kv_server_poll (and none of the server's events do), and stopping the
 * server leaves the engine running. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../harness.h"
#include "../engine_helpers.h"
#include "../../engine/engine.h"
#include "../../server/server.h"

static const int32_t prompt_ids[] = {1, 403, 407, 261, 378};

static int post(int port, const char *path, const char *body, char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    char head[512];
    int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                     path, strlen(body));
    send(fd, head, (size_t)n, MSG_NOSIGNAL);
    send(fd, body, strlen(body), MSG_NOSIGNAL);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < cap && (r = recv(fd, out + got, cap - 1 - got, 0)) > 0) got += (size_t)r;
    out[got] = 0;
    close(fd);
    int status = -1;
    return sscanf(out, "HTTP/1.%*d %d", &status) == 1 ? status : -1;
}

static void test_shared_engine(void) {
    kv_config c;
    kv_config_default(&c);
    kv_copy_str(c.model.path, sizeof c.model.path, harness_shared_path("models/stories260K.gguf"));
    c.threads = 1;
    c.kv.blocks = 128;
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    REQUIRE(e);
    REQUIRE(kv_engine_start(e) == 0);
    char msg[256];
    kv_server *s = kv_server_start(e, &c, 0, msg, sizeof msg);
    REQUIRE(s);
    int port = kv_server_port(s);
    CHECK(port > 0);
    /* the owner's request */
    int64_t mine = test_submit(e, NULL, prompt_ids, 5, 10, 0, 3);
    REQUIRE(mine > 0);
    /* an outside client's, meanwhile */
    static char out[65536];
    CHECK(post(port, "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 6, \"ignore_eos\": true}",
               out, sizeof out) == 200 && strstr(out, "\"completion_tokens\":6"));
    int tokens = 0, done = 0, foreign = 0;
    for (int i = 0; i < 300 && !done; i++) {
        kv_event ev[64];
        int n = kv_server_poll(s, ev, 64);
        for (int k = 0; k < n; k++) {
            if (ev[k].req != mine) foreign++;
            else if (ev[k].type == KV_EVENT_TOKEN) tokens++;
            else done = 1;
        }
        if (!done) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    CHECK(done && tokens == 10);
    CHECKF(foreign == 0, "%d of the server's events reached the owner", foreign);
    kv_server_stop(s);
    /* the engine goes on, read directly again */
    mine = test_submit(e, NULL, prompt_ids, 5, 10, 0, 3);
    REQUIRE(mine > 0);
    done = 0;
    for (int i = 0; i < 300 && !done; i++) {
        kv_event ev[64];
        kv_engine_wait(e, 20);
        int n = kv_engine_poll(e, ev, 64);
        for (int k = 0; k < n; k++) done |= ev[k].req == mine && ev[k].type == KV_EVENT_DONE;
    }
    CHECK(done);
    kv_engine_free(e);
}

TEST_MAIN(T(test_shared_engine))
