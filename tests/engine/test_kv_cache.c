/* test_kv_cache.c - the paged KV block manager: sizes and parameter
 * checks, prefix hits, LRU eviction order, copy-on-write and swap moving the
 * real bytes, KV_AGAIN without side effects, and a long randomised workload
 * (shared prefixes, chunked prefill, speculative rollback, preemption by
 * release and by swap, hash collisions forced) with kv_cache_check after
 * every operation and every committed K/V row verified through the pages. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../engine/kv_cache.h"
#include "../kv_cache_helpers.h"
#include "../../kernels/cpu_attention.h"

/* ---- helpers ---- */

static kv_backend *cpu(void) {
    kv_err err = {0};
    kv_backend *b = kv_backend_create("cpu", 1, &err);
    if (!b) fprintf(stderr, "  cpu backend: %s\n", err.msg);
    return b;
}

static kv_cache_params small_params(int bs, int n_blocks) {
    kv_cache_params p = {
        .n_layers = 2,
        .n_kv_heads = 2,
        .head_dim = 4,
        .dtype = KV_CACHE_F32,
        .block_size = bs,
        .n_blocks = n_blocks,
        .prefix_sharing = 1,
        .n_swap_blocks = 0,
    };
    return p;
}

/* Writes the rows of positions [p0, p1) of a sequence through the CPU
 * kv_store op; garbage != 0 writes noise instead (rejected draft tokens). */
static void write_rows(kv_cache *c, const kv_seq *s, const uint64_t *ph, int p0, int p1, uint32_t garbage) {
    kv_pages *pg = kv_cache_pages(c);
    for (int p = p0; p < p1; p++)
        for (int l = 0; l < pg->n_layers; l++) kv_store_slot_rows(pg, l, l, kv_cache_slot(c, s, p), p, ph[p], garbage);
}

/* 1 when every committed position of s reads back its expected rows. */
static int verify_rows(kv_cache *c, const kv_seq *s, const uint64_t *ph) {
    kv_pages *pg = kv_cache_pages(c);
    for (int p = 0; p < s->n_tokens; p++) {
        int32_t slot = kv_cache_slot(c, s, p);
        if (slot < 0) return 0;
        for (int l = 0; l < pg->n_layers; l++)
            if (!kv_slot_rows_ok(pg, l, l, slot, ph[p], s->id, p)) return 0;
    }
    return 1;
}

static int prefill(kv_cache *c, kv_seq *s, const int32_t *toks, const uint64_t *ph, int n) {
    return kv_prefill_rows(c, s, toks, ph, n, write_rows);
}

/* ---- sizes and parameters ---- */

static void test_params(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(16, 10);
    /* 2 (K, V) * 2 layers * 16 tokens * 2 heads * 4 floats * 4 bytes */
    CHECK(kv_cache_block_bytes(&p) == 2u * 2 * 16 * 2 * 4 * 4);
    CHECK(kv_cache_blocks_for_bytes(&p, kv_cache_block_bytes(&p) * 7 + 5) == 7);
    CHECK(kv_cache_blocks_for_bytes(&p, 100) == 0);
    p.dtype = KV_CACHE_F16;
    CHECK(kv_cache_block_bytes(&p) == 2u * 2 * 16 * 2 * 4 * 2);
    p.dtype = KV_CACHE_INT8;
    CHECK(kv_cache_block_bytes(&p) == 2u * 2 * 16 * 2 * (4 + 4));

    struct {
        const char *field;
        kv_cache_params p;
    } bad[] = {
        {"n_layers", small_params(16, 10)},   {"n_kv_heads", small_params(16, 10)},
        {"head_dim", small_params(16, 10)},   {"block_size", small_params(16, 10)},
        {"n_blocks", small_params(16, 10)},   {"dtype", small_params(16, 10)},
        {"n_swap_blocks", small_params(16, 10)},
    };
    bad[0].p.n_layers = 0;
    bad[1].p.n_kv_heads = -1;
    bad[2].p.head_dim = 0;
    bad[3].p.block_size = 0;
    bad[4].p.n_blocks = 0;
    bad[5].p.dtype = (kv_cache_dtype)99;
    bad[6].p.n_swap_blocks = -2;
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) {
        kv_err err = {0};
        kv_cache *c = kv_cache_new(&bad[i].p, b, &err);
        CHECKF(!c && err.code == KV_ERR_INVAL && strstr(err.msg, bad[i].field), "%s: %s", bad[i].field, err.msg);
        kv_cache_free(c);
    }
    kv_cache_free(NULL);

    kv_err err = {0};
    p = small_params(16, 10);
    kv_cache *c = kv_cache_new(&p, b, &err);
    REQUIRE(c);
    kv_pages *pg = kv_cache_pages(c);
    CHECK(pg->n_blocks == 10 && pg->block_size == 16 && pg->row_bytes == 16 && pg->slot_bytes == 32);
    CHECK(pg->layer_bytes == 10u * 16 * 32);
    CHECK(kv_cache_params_of(c)->n_blocks == 10);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.n_blocks == 10 && st.n_free == 10 && st.n_used == 0 && st.n_cached == 0);
    CHECK(kv_cache_n_available(c) == 10);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- reserve / slots / commit / truncate ---- */

static void test_reserve_commit_truncate(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(4, 8);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    kv_seq s;
    kv_seq_init(&s, 7, 3);
    kv_seq *live[] = {&s};
    CHECK(kv_cache_blocks_needed(c, &s, 5) == 2);
    CHECK(kv_cache_seq_reserve(c, &s, 5) == 0);
    CHECK(s.n_blocks == 2 && s.n_reserved == 8 && s.n_tokens == 0);
    CHECK(check_ok(c, live, 1));
    /* slots: distinct, inside the table's blocks */
    for (int i = 0; i < 8; i++) {
        int32_t sl = kv_cache_slot(c, &s, i);
        CHECK(sl == s.blocks[i / 4] * 4 + i % 4);
    }
    CHECK(kv_cache_slot(c, &s, 8) == -1 && kv_cache_slot(c, &s, -1) == -1);
    CHECK(kv_cache_blocks_needed(c, &s, 3) == 0); /* 0 + 3 <= 8 reserved */
    CHECK(kv_cache_blocks_needed(c, &s, 9) == 1);
    int32_t toks[32];
    for (int i = 0; i < 32; i++) toks[i] = 100 + i;
    kv_cache_seq_commit(c, &s, toks, 6);
    CHECK(s.n_tokens == 6 && s.n_hashed == 1);
    CHECK(check_ok(c, live, 1));
    kv_block_info map[8];
    kv_cache_block_map(c, map);
    CHECK(map[s.blocks[0]].fill == 4 && map[s.blocks[1]].fill == 2);
    CHECK(map[s.blocks[0]].owner == 7 && map[s.blocks[0]].owner_tag == 3 && map[s.blocks[0]].state == KV_BLOCK_USED);
    /* commit beyond the reservation or backwards is ignored */
    kv_cache_seq_commit(c, &s, toks, 9);
    kv_cache_seq_commit(c, &s, toks, 5);
    CHECK(s.n_tokens == 6);
    /* speculative: reserve 5 more (3 blocks), accept 1, roll back the rest */
    CHECK(kv_cache_seq_reserve(c, &s, 5) == 0);
    CHECK(s.n_blocks == 3);
    kv_cache_seq_commit(c, &s, toks, 7);
    kv_cache_seq_truncate(c, &s, 7);
    CHECK(s.n_blocks == 2 && s.n_tokens == 7 && s.n_reserved == 8);
    CHECK(check_ok(c, live, 1));
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.n_used == 2 && st.n_free == 6);
    /* truncate into committed tokens: registered block 0 stays registered and
     * is copied before it is written again */
    kv_cache_seq_truncate(c, &s, 2);
    CHECK(s.n_blocks == 1 && s.n_tokens == 2 && s.n_hashed == 0 && s.n_reserved == 2);
    CHECK(check_ok(c, live, 1));
    int old = s.blocks[0];
    CHECK(kv_cache_blocks_needed(c, &s, 1) == 1);
    CHECK(kv_cache_seq_reserve(c, &s, 1) == 0);
    CHECK(s.blocks[0] != old && s.n_reserved == 4);
    kv_cache_get_stats(c, &st);
    CHECK(st.cow_copies == 1 && st.n_cached == 1);
    CHECK(check_ok(c, live, 1));
    /* bad arguments change nothing */
    CHECK(kv_cache_seq_reserve(c, &s, -1) == KV_ERR_INVAL);
    CHECK(kv_cache_seq_reserve(c, &s, 1000) == KV_ERR_RANGE);
    kv_seq t;
    kv_seq_init(&t, 8, 0);
    CHECK(kv_cache_seq_reserve(c, &t, 1) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &t, toks, 8) == KV_ERR_INVAL); /* not empty */
    kv_cache_seq_release(c, &t);
    kv_cache_seq_release(c, &s);
    CHECK(s.blocks == NULL && s.n_blocks == 0 && s.id == 7);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- prefix hits ---- */

static void test_prefix_hits(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(16, 16);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t ta[40], tb[40];
    uint64_t pha[40], phb[40];
    for (int i = 0; i < 40; i++) ta[i] = tb[i] = 1000 + i * 7;
    tb[35] = 5; /* b shares a's first 32 tokens (2 blocks), then differs */
    prefix_hashes(ta, 40, pha);
    prefix_hashes(tb, 40, phb);
    kv_seq a, s2, s3, s4;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    kv_seq_init(&s3, 3, 0);
    kv_seq_init(&s4, 4, 0);
    CHECK(kv_cache_match_prefix(c, ta, 40) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &a, ta, 40) == 0);
    CHECK(prefill(c, &a, ta, pha, 40) == 0);
    kv_seq *live[] = {&a, &s2, &s3, &s4};
    CHECK(check_ok(c, live, 4));

    CHECK(kv_cache_match_prefix(c, tb, 40) == 32);
    CHECK(kv_cache_match_prefix(c, tb, 20) == 16);
    CHECK(kv_cache_match_prefix(c, tb, 15) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s2, tb, 40) == 32);
    CHECK(s2.n_tokens == 32 && s2.n_blocks == 2 && s2.blocks[0] == a.blocks[0] && s2.blocks[1] == a.blocks[1]);
    CHECK(prefill(c, &s2, tb, phb, 40) == 0);
    CHECK(verify_rows(c, &a, pha) && verify_rows(c, &s2, phb));
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.lookups == 2 && st.hit_blocks == 2 && st.hit_tokens == 32 && st.n_shared == 2);
    CHECK(check_ok(c, live, 4));

    /* a chain is keyed by its whole prefix: the same second block after a
     * different first block is no hit */
    int32_t tc[32];
    memcpy(tc, ta, sizeof tc);
    tc[0] = 99;
    CHECK(kv_cache_match_prefix(c, tc, 32) == 0);

    /* the whole prompt cached: all blocks attached, n_tokens = n - 1, the
     * last block copied when the last token is recomputed, and the commit
     * swaps back to the cached block */
    CHECK(kv_cache_match_prefix(c, ta, 32) == 31);
    CHECK(kv_cache_seq_attach_prefix(c, &s3, ta, 32) == 31);
    CHECK(s3.n_blocks == 2 && s3.n_tokens == 31 && s3.n_reserved == 31);
    CHECK(check_ok(c, live, 4));
    CHECK(kv_cache_blocks_needed(c, &s3, 1) == 1);
    CHECK(prefill(c, &s3, ta, pha, 32) == 0);
    kv_cache_get_stats(c, &st);
    CHECK(st.cow_copies == 1);
    CHECK(s3.blocks[1] == a.blocks[1]); /* deduplicated back onto the original */
    CHECK(verify_rows(c, &s3, pha));
    CHECK(check_ok(c, live, 4));
    CHECK(st.lookups == 3 && st.hit_blocks == 4 && st.hit_tokens == 63);

    /* released prompts stay cached and are hit again */
    kv_cache_seq_release(c, &a);
    kv_cache_seq_release(c, &s2);
    kv_cache_seq_release(c, &s3);
    kv_cache_get_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_cached == 2); /* a's two full blocks; the partial third blocks are freed */
    /* admission plans: two cached blocks leave the evictable pool, plus one
     * new block / plus the copy of the fully cached last block */
    int reuse = -1;
    CHECK(kv_cache_blocks_to_admit(c, tb, 40, 40, &reuse) == 3 && reuse == 32);
    CHECK(kv_cache_blocks_to_admit(c, ta, 32, 32, &reuse) == 3 && reuse == 31);
    CHECK(kv_cache_blocks_to_admit(c, ta, 32, 31, &reuse) == 2 && reuse == 31);
    CHECK(kv_cache_blocks_to_admit(c, tc, 32, 32, &reuse) == 2 && reuse == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s4, tb, 40) == 32);
    CHECK(verify_rows(c, &s4, phb));
    CHECK(kv_cache_blocks_to_admit(c, tb, 40, 40, &reuse) == 1 && reuse == 32); /* now shared, not cached */
    kv_cache_get_stats(c, &st);
    CHECK(st.n_cached == 0 && st.n_used == 2);
    CHECK(check_ok(c, live, 4));
    kv_cache_seq_release(c, &s4);

    /* sharing off: nothing is indexed, attach reuses nothing */
    kv_cache_free(c);
    p.prefix_sharing = 0;
    c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    CHECK(prefill(c, &a, ta, pha, 40) == 0);
    CHECK(kv_cache_match_prefix(c, ta, 40) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s2, ta, 40) == 0);
    kv_cache_seq_release(c, &a);
    kv_cache_get_stats(c, &st);
    CHECK(st.n_free == 16 && st.lookups == 0);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* Hash collisions everywhere (2-bit hashes): lookups must still share only
 * exact prefixes. */
static void test_hash_collisions(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(4, 64);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    CHECK(kv_cache_set_hash_bits(c, 2) == 0);
    enum { NS = 8, L = 20 };
    kv_seq s[NS];
    int32_t t[NS][L];
    uint64_t ph[NS][L];
    kv_seq *live[NS];
    uint64_t rs = 5;
    for (int i = 0; i < NS; i++) {
        for (int j = 0; j < L; j++) t[i][j] = rnd(&rs, 3); /* tiny alphabet: many equal blocks */
        if (i % 2) memcpy(t[i], t[i - 1], 8 * sizeof(int32_t));
        prefix_hashes(t[i], L, ph[i]);
        kv_seq_init(&s[i], i, 0);
        live[i] = &s[i];
        int got = kv_cache_seq_attach_prefix(c, &s[i], t[i], L);
        CHECK(got >= 0 && got == s[i].n_tokens);
        if (i % 2) CHECK(got >= 8);
        CHECK(prefill(c, &s[i], t[i], ph[i], L) == 0);
        CHECK(check_ok(c, live, i + 1));
    }
    for (int i = 0; i < NS; i++) CHECK(verify_rows(c, &s[i], ph[i]));
    CHECK(kv_cache_set_hash_bits(c, 64) == KV_ERR_INVAL); /* blocks registered */
    for (int i = 0; i < NS; i++) kv_cache_seq_release(c, &s[i]);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- eviction ---- */

static void test_eviction_lru(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(4, 8);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t t[3][9];
    uint64_t ph[3][9];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 9; j++) t[i][j] = 10 * i + j;
        prefix_hashes(t[i], 9, ph[i]);
        kv_seq s;
        kv_seq_init(&s, i, 0);
        CHECK(prefill(c, &s, t[i], ph[i], 8) == 0);
        kv_cache_seq_release(c, &s); /* released in order 0, 1, 2 */
    }
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.n_cached == 6 && st.n_free == 2 && kv_cache_n_available(c) == 8);
    for (int i = 0; i < 3; i++) CHECK(kv_cache_match_prefix(c, t[i], 9) == 8);
    kv_block_info map[8];
    kv_cache_block_map(c, map);
    int n_cached = 0;
    for (int i = 0; i < 8; i++)
        if (map[i].state == KV_BLOCK_CACHED) CHECK(map[i].refcount == 0 && map[i].fill == 4 && ++n_cached);
    CHECK(n_cached == 6);

    /* touch prompt 0 again: it becomes the most recently used */
    kv_seq s;
    kv_seq_init(&s, 10, 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s, t[0], 9) == 8);
    kv_cache_seq_release(c, &s);

    /* Free blocks go first, then LRU order 1, 2, 0; within a prompt the
     * tail block before the head. */
    kv_seq d;
    kv_seq_init(&d, 20, 0);
    kv_seq *live[] = {&d};
    CHECK(kv_cache_seq_reserve(c, &d, 8) == 0); /* the 2 free blocks */
    kv_cache_get_stats(c, &st);
    CHECK(st.evictions == 0);
    CHECK(kv_cache_seq_reserve(c, &d, 12) == 0); /* evicts 1's tail */
    kv_cache_get_stats(c, &st);
    CHECK(st.evictions == 1);
    CHECK(kv_cache_match_prefix(c, t[1], 9) == 4);
    CHECK(kv_cache_match_prefix(c, t[2], 9) == 8 && kv_cache_match_prefix(c, t[0], 9) == 8);
    CHECK(kv_cache_seq_reserve(c, &d, 16) == 0); /* evicts 1's head */
    CHECK(kv_cache_match_prefix(c, t[1], 9) == 0 && kv_cache_match_prefix(c, t[2], 9) == 8);
    CHECK(kv_cache_seq_reserve(c, &d, 24) == 0); /* evicts 2 entirely */
    CHECK(kv_cache_match_prefix(c, t[2], 9) == 0 && kv_cache_match_prefix(c, t[0], 9) == 8);
    kv_cache_get_stats(c, &st);
    CHECK(st.evictions == 4 && st.n_cached == 2 && st.n_free == 0);
    CHECK(check_ok(c, live, 1));
    /* the whole pool: evicts the last cached prompt; one more is KV_AGAIN */
    CHECK(kv_cache_seq_reserve(c, &d, 32) == 0);
    CHECK(kv_cache_seq_reserve(c, &d, 33) == KV_ERR_RANGE);
    kv_seq e;
    kv_seq_init(&e, 21, 0);
    CHECK(kv_cache_seq_reserve(c, &e, 1) == KV_AGAIN);
    CHECK(e.n_blocks == 0 && e.blocks == NULL);
    kv_cache_get_stats(c, &st);
    CHECK(st.evictions == 6 && st.n_used == 8);
    CHECK(check_ok(c, live, 1));
    kv_cache_seq_release(c, &d);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- copy-on-write and swap move the bytes ---- */

static void fill_block_rows(kv_cache *c, int blk, float base) {
    kv_pages *pg = kv_cache_pages(c);
    size_t bb = (size_t)pg->block_size * pg->slot_bytes;
    for (int l = 0; l < pg->n_layers; l++)
        for (size_t i = 0; i < bb / 4; i++) {
            float fk = base + (float)(l * 100000 + (int)i), fv = -fk;
            memcpy(pg->k + l * pg->layer_bytes + blk * bb + 4 * i, &fk, 4);
            memcpy(pg->v + l * pg->layer_bytes + blk * bb + 4 * i, &fv, 4);
        }
}

/* 1 when blocks a and b hold the same rows for their first n_tokens slots,
 * every layer and kv head, K and V. */
static int same_block_rows(kv_cache *c, int a, int b, int n_tokens) {
    kv_pages *pg = kv_cache_pages(c);
    const int64_t bs = pg->block_size;
    const size_t n = (size_t)n_tokens * pg->row_bytes; /* a head's rows of a block are contiguous */
    for (int l = 0; l < pg->n_layers; l++)
        for (int g = 0; g < pg->n_kv_heads; g++) {
            size_t oa = kv_pages_row_offset(pg, l, a * bs, g), ob = kv_pages_row_offset(pg, l, b * bs, g);
            if (memcmp(pg->k + oa, pg->k + ob, n) || memcmp(pg->v + oa, pg->v + ob, n)) return 0;
        }
    return 1;
}

static void test_cow_copies_bytes(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(8, 8);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t t[16];
    uint64_t ph[16];
    for (int i = 0; i < 16; i++) t[i] = 3 * i + 1;
    prefix_hashes(t, 16, ph);
    kv_seq a, s2;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    kv_seq *live[] = {&a, &s2};
    CHECK(prefill(c, &a, t, ph, 16) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s2, t, 16) == 15);
    int orig = s2.blocks[1];
    CHECK(orig == a.blocks[1]);
    CHECK(kv_cache_seq_reserve(c, &s2, 1) == 0);
    int copy = s2.blocks[1];
    CHECK(copy != orig);
    CHECK(same_block_rows(c, copy, orig, 8)); /* every layer, K and V, whole block */
    /* writing the copy leaves the original alone */
    uint32_t garbage = 777;
    write_rows(c, &s2, ph, 15, 16, garbage);
    CHECK(same_block_rows(c, copy, orig, 7));
    CHECK(!same_block_rows(c, copy, orig, 8));
    CHECK(verify_rows(c, &a, ph));
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.cow_copies == 1 && st.n_shared == 1);
    CHECK(check_ok(c, live, 2));
    kv_cache_seq_release(c, &a);
    kv_cache_seq_release(c, &s2);
    kv_cache_free(c);
    kv_backend_free(b);
}

static void test_swap_round_trip(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(4, 10);
    p.n_swap_blocks = 6;
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t ta[14], tb[14];
    uint64_t pha[14], phb[14];
    for (int i = 0; i < 14; i++) ta[i] = tb[i] = 50 + i;
    tb[9] = 1; /* b shares a's first 2 blocks */
    prefix_hashes(ta, 14, pha);
    prefix_hashes(tb, 14, phb);
    kv_seq a, s2, x;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    kv_seq_init(&x, 3, 0);
    kv_seq *live[] = {&a, &s2, &x};
    CHECK(prefill(c, &a, ta, pha, 14) == 0);
    CHECK(kv_cache_seq_attach_prefix(c, &s2, tb, 14) == 8);
    CHECK(prefill(c, &s2, tb, phb, 14) == 0);
    CHECK(check_ok(c, live, 3));

    /* plain round trip: a alone, overwrite what it left, bring it back */
    kv_cache_seq_release(c, &s2);
    kv_seq_init(&s2, 2, 0);
    CHECK(kv_cache_seq_swap_out(c, &a) == 0);
    CHECK(a.swapped && kv_cache_slot(c, &a, 0) == -1);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.n_swap_used == 4 && st.swapped_out == 4 && st.n_used == 0);
    CHECK(check_ok(c, live, 3));
    CHECK(kv_cache_seq_reserve(c, &a, 1) == KV_ERR_INVAL);
    CHECK(kv_cache_seq_swap_out(c, &a) == KV_ERR_INVAL);
    /* x takes the whole device pool (evicting a's cached prefix), scribbling */
    CHECK(kv_cache_seq_reserve(c, &x, 40) == 0);
    for (int i = 0; i < x.n_blocks; i++) fill_block_rows(c, x.blocks[i], 1e6f + (float)i);
    CHECK(kv_cache_seq_swap_in(c, &a) == KV_AGAIN);
    CHECK(a.swapped);
    CHECK(check_ok(c, live, 3));
    kv_cache_seq_release(c, &x);
    kv_seq_init(&x, 3, 0);
    CHECK(kv_cache_seq_swap_in(c, &a) == 0);
    CHECK(!a.swapped && verify_rows(c, &a, pha));
    kv_cache_get_stats(c, &st);
    CHECK(st.swapped_in == 4 && st.n_swap_used == 0);
    CHECK(check_ok(c, live, 3));
    /* the swapped-in prefix is registered again: b hits it */
    CHECK(kv_cache_seq_attach_prefix(c, &s2, tb, 14) == 8);
    CHECK(prefill(c, &s2, tb, phb, 14) == 0);

    /* swapping out a sequence that shares its prefix: on swap-in the shared
     * blocks are found on the device and not copied */
    CHECK(kv_cache_seq_swap_out(c, &s2) == 0);
    kv_cache_get_stats(c, &st);
    CHECK(st.swapped_out == 8 && st.n_swap_used == 4);
    CHECK(check_ok(c, live, 3));
    CHECK(kv_cache_seq_swap_in(c, &s2) == 0);
    kv_cache_get_stats(c, &st);
    CHECK(st.swapped_in == 4 + 1); /* blocks 0, 1 shared with a, block 2 still cached */
    CHECK(s2.blocks[0] == a.blocks[0] && s2.blocks[1] == a.blocks[1]);
    CHECK(verify_rows(c, &s2, phb) && verify_rows(c, &a, pha));
    CHECK(check_ok(c, live, 3));
    /* the host pool has 6 blocks: a (4) fits once, not twice */
    CHECK(kv_cache_seq_swap_out(c, &a) == 0);
    CHECK(kv_cache_seq_swap_out(c, &s2) == KV_AGAIN && !s2.swapped);
    CHECK(check_ok(c, live, 3));
    /* releasing a swapped sequence frees its host blocks */
    kv_cache_seq_release(c, &a);
    kv_cache_get_stats(c, &st);
    CHECK(st.n_swap_used == 0);
    CHECK(check_ok(c, live, 3));
    kv_cache_seq_release(c, &s2);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- KV_AGAIN changes nothing ---- */

typedef struct cache_state {
    kv_cache_stats st;
    kv_block_info map[128];
    kv_seq s;
    int32_t blocks[128];
} cache_state;

static void snap(kv_cache *c, const kv_seq *s, cache_state *o) {
    memset(o, 0, sizeof *o);
    kv_cache_get_stats(c, &o->st);
    kv_cache_block_map(c, o->map);
    o->s = *s;
    if (s->n_blocks) memcpy(o->blocks, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
}

static int same_state(kv_cache *c, const kv_seq *s, const cache_state *o) {
    cache_state now;
    snap(c, s, &now);
    int nb = kv_cache_params_of(c)->n_blocks;
    return !memcmp(&now.st, &o->st, sizeof now.st) &&
           !memcmp(now.map, o->map, (size_t)nb * sizeof(kv_block_info)) && now.s.n_blocks == o->s.n_blocks &&
           now.s.n_tokens == o->s.n_tokens && now.s.n_reserved == o->s.n_reserved &&
           now.s.n_hashed == o->s.n_hashed && now.s.swapped == o->s.swapped &&
           !memcmp(now.blocks, o->blocks, sizeof now.blocks);
}

static void test_again_no_side_effects(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(4, 6);
    p.n_swap_blocks = 2;
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t t[24];
    uint64_t ph[24];
    for (int i = 0; i < 24; i++) t[i] = i;
    prefix_hashes(t, 24, ph);
    kv_seq a, s2;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    CHECK(prefill(c, &a, t, ph, 8) == 0);
    kv_cache_seq_release(c, &a); /* 2 cached */
    kv_seq_init(&a, 1, 0);
    CHECK(kv_cache_seq_attach_prefix(c, &a, t, 24) == 8);
    CHECK(prefill(c, &a, t, ph, 14) == 0); /* 4 blocks */
    CHECK(kv_cache_seq_attach_prefix(c, &s2, t, 7) == 4);
    CHECK(kv_cache_seq_reserve(c, &s2, 3) == 0);
    cache_state before;
    snap(c, &a, &before);
    CHECK(kv_cache_blocks_needed(c, &a, 10) == 2 && kv_cache_n_available(c) == 1);
    CHECK(kv_cache_seq_reserve(c, &a, 10) == KV_AGAIN);
    CHECK(same_state(c, &a, &before));
    CHECK(kv_cache_seq_swap_out(c, &a) == KV_AGAIN); /* 4 blocks, host pool of 2 */
    CHECK(same_state(c, &a, &before));
    kv_seq *live[] = {&a, &s2};
    CHECK(check_ok(c, live, 2));
    kv_cache_seq_release(c, &a);
    kv_cache_seq_release(c, &s2);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- the randomised workload ---- */

enum { W_SEQS = 10, W_MAXLEN = 72 }; /* W_MAXLEN <= KV_WSEQ_CAP */

typedef struct wstats {
    int ops, again, swaps_out, swaps_in, releases, attaches, hits, rollbacks, truncs_committed;
} wstats;

static void workload(int bs, int n_blocks, int n_swap, int sharing, int hash_bits, int n_ops, uint64_t seed) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = small_params(bs, n_blocks);
    p.n_swap_blocks = n_swap;
    p.prefix_sharing = sharing;
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    if (hash_bits) CHECK(kv_cache_set_hash_bits(c, hash_bits) == 0);
    wseq *w = calloc(W_SEQS, sizeof *w);
    REQUIRE(w);
    /* a few shared prompt prefixes (system prompts) */
    int32_t pre[3][40];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 40; i++) pre[k][i] = 1000 * (k + 1) + i;
    uint64_t rs = seed;
    wstats ws = {0};
    uint64_t expect_hit_tokens = 0, expect_lookups = 0;
    int next_id = 1, failed = 0;
    kv_seq *live[W_SEQS];
    for (int op = 0; op < n_ops && !failed; op++) {
        ws.ops++;
        wseq *q = &w[rnd(&rs, W_SEQS)];
        int r = rnd(&rs, 100);
        cache_state before;
        if (!q->live) {
            /* arrival: prefix + random suffix; attach the cached prefix */
            kv_seq_init(&q->s, next_id++, rnd(&rs, 4));
            int k = rnd(&rs, 4);
            int plen = k < 3 ? rnd(&rs, 41) : 0;
            if (k < 3 && plen < 8 && rnd(&rs, 2)) plen += 8;
            q->len = plen + 1 + rnd(&rs, 16);
            for (int i = 0; i < q->len; i++) q->t[i] = i < plen ? pre[k][i] : rnd(&rs, 50);
            prefix_hashes(q->t, q->len, q->ph);
            int m = kv_cache_match_prefix(c, q->t, q->len);
            int first = KV_MIN(q->len, 1 + rnd(&rs, 4 * bs)), reuse = -1;
            int plan = kv_cache_blocks_to_admit(c, q->t, q->len, first, &reuse);
            int avail = kv_cache_n_available(c);
            int got = kv_cache_seq_attach_prefix(c, &q->s, q->t, q->len);
            CHECKF(got == m && reuse == m, "attach %d, match %d, planned reuse %d", got, m, reuse);
            /* the plan says exactly whether the first chunk's reserve fits */
            int rc = first > got ? kv_cache_seq_reserve(c, &q->s, first - got) : 0;
            CHECKF((rc == 0) == (plan <= avail), "admit plan %d blocks, %d available, reserve rc %d", plan, avail,
                   rc);
            if (rc == KV_AGAIN) ws.again++;
            if (sharing) expect_lookups++;
            expect_hit_tokens += (uint64_t)(got > 0 ? got : 0);
            ws.attaches++;
            ws.hits += got > 0;
            q->live = 1;
        } else if (q->s.swapped) {
            snap(c, &q->s, &before);
            int rc = kv_cache_seq_swap_in(c, &q->s);
            if (rc == KV_AGAIN) {
                ws.again++;
                CHECK(same_state(c, &q->s, &before));
            } else {
                CHECK(rc == 0);
                ws.swaps_in++;
            }
            if (r < 10) { /* give up on it while swapped */
                kv_cache_seq_release(c, &q->s);
                q->live = 0;
            }
        } else if (r < 6) {
            kv_cache_seq_release(c, &q->s);
            q->live = 0;
            ws.releases++;
        } else if (r < 12 && n_swap > 0) {
            snap(c, &q->s, &before);
            int rc = kv_cache_seq_swap_out(c, &q->s);
            if (rc == KV_AGAIN) {
                ws.again++;
                CHECK(same_state(c, &q->s, &before));
            } else {
                CHECK(rc == 0 && q->s.swapped);
                ws.swaps_out++;
            }
        } else if (r < 16 && q->s.n_tokens > 0) {
            /* roll back into committed tokens (recompute them later) */
            int back = KV_MIN(q->s.n_tokens, 2 * bs);
            kv_cache_seq_truncate(c, &q->s, q->s.n_tokens - 1 - rnd(&rs, back));
            ws.truncs_committed++;
        } else {
            /* a step: chunk of known tokens (prefill) or one new token, plus
             * up to 3 speculative positions that are then rejected */
            if (q->s.n_tokens == q->len) {
                if (q->len == W_MAXLEN) {
                    kv_cache_seq_release(c, &q->s);
                    q->live = 0;
                    continue;
                }
                q->t[q->len] = rnd(&rs, 50);
                q->ph[q->len] = prefix_step(q->len ? q->ph[q->len - 1] : 0x1234, q->t[q->len]);
                q->len++;
            }
            /* (KV_MIN evaluates its arguments twice: draw first) */
            int chunk = 1 + rnd(&rs, 3 * bs), draft = rnd(&rs, 4);
            int n = KV_MIN(q->len - q->s.n_tokens, chunk);
            int spec = KV_MIN(draft, W_MAXLEN - q->s.n_tokens - n);
            snap(c, &q->s, &before);
            int need = kv_cache_blocks_needed(c, &q->s, n + spec);
            int rc = kv_cache_seq_reserve(c, &q->s, n + spec);
            if (rc == KV_AGAIN) {
                ws.again++;
                CHECK(need > kv_cache_n_available(c));
                CHECK(same_state(c, &q->s, &before));
            } else {
                CHECKF(rc == 0, "reserve rc %d (n %d spec %d, n_tokens %d len %d swapped %d)", rc, n, spec, q->s.n_tokens, q->len, q->s.swapped);
                int n0 = q->s.n_tokens;
                write_rows(c, &q->s, q->ph, n0, n0 + n, 0);
                if (spec) write_rows(c, &q->s, q->ph, n0 + n, n0 + n + spec, 0xbad0 + (uint32_t)op);
                kv_cache_seq_commit(c, &q->s, q->t, n0 + n);
                kv_cache_seq_truncate(c, &q->s, n0 + n);
                ws.rollbacks += spec > 0;
            }
        }
        int nl = live_list(w, W_SEQS, live);
        if (!check_ok(c, live, nl)) {
            fprintf(stderr, "  after op %d\n", op);
            failed = 1;
        }
        for (int i = 0; i < W_SEQS && !failed; i++)
            if (w[i].live && !w[i].s.swapped && !verify_rows(c, &w[i].s, w[i].ph)) {
                fprintf(stderr, "  wrong K/V after op %d\n", op);
                failed = 1;
            }
    }
    CHECK(!failed);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(st.hit_tokens == expect_hit_tokens && st.lookups == expect_lookups);
    printf("    bs %d, %d blocks, swap %d, sharing %d, hash bits %d: %d ops, %d attach (%d hit, %llu tokens), "
           "%d KV_AGAIN, %d swap out, %d swap in, %d rollbacks, %llu evictions, %llu cow\n",
           bs, n_blocks, n_swap, sharing, hash_bits, ws.ops, ws.attaches, ws.hits,
           (unsigned long long)st.hit_tokens, ws.again, ws.swaps_out, ws.swaps_in, ws.rollbacks,
           (unsigned long long)st.evictions, (unsigned long long)st.cow_copies);
    if (sharing) CHECK(ws.hits > 0 && st.evictions > 0);
    CHECK(ws.again > 0);
    if (n_swap) CHECK(ws.swaps_in > 0);
    for (int i = 0; i < W_SEQS; i++)
        if (w[i].live) kv_cache_seq_release(c, &w[i].s);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_get_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_swap_used == 0 && st.n_free + st.n_cached == n_blocks);
    free(w);
    kv_cache_free(c);
    kv_backend_free(b);
}

static void test_workload_bs4(void) { workload(4, 48, 24, 1, 0, 20000, 1); }
static void test_workload_collisions(void) { workload(4, 48, 24, 1, 3, 20000, 2); }
static void test_workload_bs1(void) { workload(1, 80, 40, 1, 0, 10000, 3); }
static void test_workload_bs16(void) { workload(16, 12, 6, 1, 0, 10000, 4); }
static void test_workload_no_sharing(void) { workload(4, 48, 0, 0, 0, 5000, 5); }

TEST_MAIN(T(test_params), T(test_reserve_commit_truncate), T(test_prefix_hits), T(test_hash_collisions),
          T(test_eviction_lru), T(test_cow_copies_bytes), T(test_swap_round_trip), T(test_again_no_side_effects),
          T(test_workload_bs4), T(test_workload_collisions), T(test_workload_bs1), T(test_workload_bs16),
          T(test_workload_no_sharing))
