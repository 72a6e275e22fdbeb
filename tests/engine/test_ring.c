/* test_ring.c - the engine's record ring (engine/ring.h): growth without a
 * limit, overwriting the oldest at the limit, lowering the limit, and
 * popping in order. */
#include "../harness.h"
#include "../../engine/ring.h"

static void test_unlimited(void) {
    kv_ring r;
    kv_ring_init(&r, sizeof(int), 0);
    for (int i = 0; i < 1000; i++) CHECK(kv_ring_push(&r, &i) == 0);
    REQUIRE(r.n == 1000);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= *(int *)kv_ring_at(&r, i) == i;
    CHECK(ok);
    int out[300];
    CHECK(kv_ring_pop(&r, out, 300) == 300 && out[0] == 0 && out[299] == 299 && r.n == 700);
    int x = 1000;
    kv_ring_push(&r, &x); /* wraps behind the popped head */
    CHECK(*(int *)kv_ring_at(&r, 0) == 300 && *(int *)kv_ring_at(&r, r.n - 1) == 1000);
    CHECK(kv_ring_pop(&r, out, 0) == 0 && kv_ring_pop(&r, out, -1) == 0 && r.n == 701);
    kv_ring_free(&r);
    CHECK(r.n == 0 && r.v == NULL);
}

static void test_limit(void) {
    kv_ring r;
    kv_ring_init(&r, sizeof(int), 5);
    for (int i = 0; i < 12; i++) kv_ring_push(&r, &i);
    REQUIRE(r.n == 5);
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= *(int *)kv_ring_at(&r, i) == 7 + i; /* the newest five */
    CHECK(ok);
    kv_ring_set_limit(&r, 0); /* no limit: grows again */
    for (int i = 12; i < 20; i++) kv_ring_push(&r, &i);
    CHECK(r.n == 13 && *(int *)kv_ring_at(&r, 0) == 7);
    kv_ring_set_limit(&r, 3); /* lower: the oldest go at once */
    CHECK(r.n == 3 && *(int *)kv_ring_at(&r, 0) == 17 && *(int *)kv_ring_at(&r, 2) == 19);
    kv_ring_free(&r);
}

TEST_MAIN(T(test_unlimited), T(test_limit))
