/* test_kv_events_sub.c - the KV-event subscriber's edges: endpoints it
 * refuses, the message without libzmq, and a subscriber on a port where
 * nothing publishes: it starts, reports no batch, and stops within a
 * bounded time. (The wire itself is tests/e2e/kv_events.sh.) */
#include <time.h>

#include "../../tui/kv_events_sub.h"
#include "../harness.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_endpoints(void) {
    kv_err err;
    CHECK(kv_kvsub_check_endpoint("tcp://127.0.0.1:5557", &err) == 0);
    CHECK(kv_kvsub_check_endpoint("tcp://gpu-host:1", &err) == 0);
    const char *bad[] = {"", "127.0.0.1:5557", "tcp://", "tcp://host", "tcp://host:", "tcp://:5557",
                         "tcp://host:0", "tcp://host:65536", "tcp://host:55x", "tcp://*:5557", "ipc:///tmp/x", NULL};
    for (int i = 0; bad[i]; i++) CHECKF(kv_kvsub_check_endpoint(bad[i], &err) == KV_ERR_INVAL, "'%s' accepted", bad[i]);
    CHECK(kv_kvsub_check_endpoint(NULL, &err) == KV_ERR_INVAL);
    CHECK(kv_kvsub_new("tcp://h:1", "nope", 16, &err) == NULL && strstr(err.msg, "tcp://HOST:PORT"));
}

static void test_idle_subscriber(void) {
    kv_err err;
    kv_kvsub *s = kv_kvsub_new("tcp://127.0.0.1:9", "tcp://127.0.0.1:9", 64, &err);
    if (!kv_kvsub_available()) {
        CHECK(s == NULL && strstr(err.msg, "libzmq"));
        return;
    }
    REQUIRE(s);
    REQUIRE(kv_kvsub_start(s) == 0);
    struct timespec d = {0, 300 * 1000 * 1000};
    nanosleep(&d, NULL);
    kv_ptree_view v;
    kv_kvsub_status st;
    uint64_t seq = 0;
    kv_kvsub_take(s, &v, &seq, &st);
    CHECK(!st.have_batch && st.since_last_s < 0 && st.bad_frames == 0 && !strcmp(st.endpoint, "tcp://127.0.0.1:9"));
    CHECK(st.replays == 1); /* the start-up replay request, unanswered (or not sent) */
    double t0 = now_s();
    kv_kvsub_free(s); /* even with the replay wait (2 s) in flight: it checks stop every 100 ms */
    CHECKF(now_s() - t0 < 1.0, "stopping took %.2f s", now_s() - t0);
}

TEST_MAIN(T(test_endpoints), T(test_idle_subscriber))
