/* test_memory_budget.c - `memory.budget` on the real stories260K model: the
 * KV cache gets exactly what the weights and activations leave, quantized
 * KV holds more blocks in the same budget, kv.blocks still wins, and a
 * budget the weights do not fit in is refused with a message naming it. */
#include <stdio.h>
#include <string.h>

#include "../../engine/engine.h"
#include "../../engine/kv_cache.h"
#include "../engine_helpers.h"
#include "../harness.h"

/* stories260K with no KV size of its own: the budget must give it one. */
static void base(kv_config *c) {
    test_engine_config(c, NULL, 1, 0, 8, 128);
    c->kv.memory = 0;
    c->scheduler.prefill_chunk = 64;
}

/* Builds an engine for c and returns its first snapshot in s (0), or -1. */
static int snap_of(const kv_config *c, kv_snapshot *s) {
    kv_err err = {0};
    kv_engine *e = kv_engine_new(c, &err);
    if (!e) {
        fprintf(stderr, "  engine: %s\n", err.msg);
        return -1;
    }
    int rc = kv_engine_snapshot(e, s);
    kv_engine_free(e);
    return rc;
}

static uint64_t kv_total(const kv_snapshot *s) { return s->mem.kv_used + s->mem.kv_cached + s->mem.kv_free; }

static void test_budget_splits(void) {
    kv_config c;
    base(&c);
    const uint64_t budget = 6ull << 20;
    c.memory.budget = budget;
    c.kv.dtype = KV_CACHE_F16;
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s);
    REQUIRE(snap_of(&c, s) == 0);
    const kv_mem_breakdown *m = &s->mem;
    CHECK(m->budget == budget);
    /* The cache takes every whole block the rest leaves. */
    uint64_t block = kv_total(s) / (uint64_t)s->n_blocks;
    const uint64_t weights = m->weights, m_act = m->activations, rest = weights + m_act;
    CHECKF(rest + kv_total(s) <= budget && rest + kv_total(s) + block > budget, "weights %llu act %llu kv %llu",
           (unsigned long long)m->weights, (unsigned long long)m->activations, (unsigned long long)kv_total(s));
    int f16_blocks = s->n_blocks;

    /* int8 KV: one byte per element plus an f32 scale per token and head
     * (stories260K's heads are 8 wide: 12 bytes against f16's 16), so more
     * blocks in the same budget, the same split, the same weights. */
    uint64_t f16_kv = kv_total(s);
    c.kv.dtype = KV_CACHE_INT8;
    REQUIRE(snap_of(&c, s) == 0);
    uint64_t i8_block = kv_total(s) / (uint64_t)s->n_blocks;
    CHECKF(i8_block * 4 == block * 3, "int8 block %llu vs f16 %llu bytes", (unsigned long long)i8_block,
           (unsigned long long)block);
    CHECKF((uint64_t)s->n_blocks * i8_block <= budget - rest && (uint64_t)(s->n_blocks + 1) * i8_block > budget - rest,
           "int8 %d vs f16 %d blocks", s->n_blocks, f16_blocks);
    CHECK(s->n_blocks > f16_blocks && kv_total(s) >= f16_kv - block);
    CHECK(s->mem.weights == weights && s->mem.activations == m_act);

    /* kv.memory is overridden by the budget; kv.blocks wins over both. */
    c.kv.dtype = KV_CACHE_F16;
    c.kv.memory = 64ull << 20;
    REQUIRE(snap_of(&c, s) == 0);
    CHECK(s->n_blocks == f16_blocks);
    c.kv.blocks = 7;
    REQUIRE(snap_of(&c, s) == 0);
    CHECK(s->n_blocks == 7 && s->mem.budget == 0);
    kv_snapshot_free(s);
}

static void test_budget_too_small(void) {
    kv_config c;
    base(&c);
    c.memory.budget = 512 << 10; /* less than the weights (1.1 MiB) */
    kv_err err = {0};
    kv_engine *e = kv_engine_new(&c, &err);
    CHECK(!e);
    CHECKF(err.code == KV_ERR_INVAL && strstr(err.msg, "memory.budget") && strstr(err.msg, "weights"), "%s",
           err.msg);
    kv_engine_free(e);
    /* Everything 0: the message names the keys to set. */
    c.memory.budget = 0;
    e = kv_engine_new(&c, &err);
    CHECK(!e && strstr(err.msg, "memory.budget") && strstr(err.msg, "kv.memory"));
    kv_engine_free(e);
}

TEST_MAIN(T(test_budget_splits), T(test_budget_too_small))
