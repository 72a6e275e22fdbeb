/* test_kv_events.c - the msgpack reader, vLLM's KV-event batches in both
 * layouts (array_like and map), and the prefix tree they rebuild, on
 * hand-built batches: chains, shared prefixes and their hit potential,
 * removals with their depth, AllBlocksCleared, a refused batch changing
 * nothing (every truncation of a good one refused), sequence gaps, a
 * hostile cycle, a full tree, and the hash table against a plain set. */
#include "../../engine/kv_events.h"
#include "../../engine/msgpack.h"
#include "../harness.h"

/* ---- a tiny msgpack writer for building batches ---- */
typedef struct wb {
    uint8_t b[65536];
    size_t n;
} wb;
static void put(wb *w, const void *p, size_t n) {
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void be_put(wb *w, uint64_t x, int n) {
    for (int i = n - 1; i >= 0; i--) w->b[w->n++] = (uint8_t)(x >> (8 * i));
}
static void mp_arr(wb *w, uint32_t n) {
    if (n < 16) w->b[w->n++] = (uint8_t)(0x90 | n);
    else w->b[w->n++] = 0xdc, be_put(w, n, 2);
}
static void mp_map(wb *w, uint32_t n) { w->b[w->n++] = (uint8_t)(0x80 | n); }
static void mp_str(wb *w, const char *s) {
    size_t n = strlen(s);
    if (n < 32) w->b[w->n++] = (uint8_t)(0xa0 | n);
    else w->b[w->n++] = 0xd9, w->b[w->n++] = (uint8_t)n;
    put(w, s, n);
}
static void mp_uint(wb *w, uint64_t x) {
    if (x < 128) w->b[w->n++] = (uint8_t)x;
    else w->b[w->n++] = 0xcf, be_put(w, x, 8);
}
static void mp_nil(wb *w) { w->b[w->n++] = 0xc0; }
static void mp_f64(wb *w, double f) {
    uint64_t x;
    memcpy(&x, &f, 8);
    w->b[w->n++] = 0xcb;
    be_put(w, x, 8);
}
static void mp_bin32(wb *w, int id) {
    uint8_t h[32];
    for (int i = 0; i < 32; i++) h[i] = (uint8_t)(id * 31 + i);
    w->b[w->n++] = 0xc4;
    w->b[w->n++] = 32;
    put(w, h, 32);
}

/* hash ids: ints 1000+id in the array layout, 32-byte bins in the map one */
static void mp_hash(wb *w, int id, int bin) {
    if (bin) mp_bin32(w, id);
    else mp_uint(w, 0x9e3779b97f4a7c15ull ^ (uint64_t)id);
}

static void stored(wb *w, int map, const int *ids, int n, int parent, int bs) {
    if (map) {
        mp_map(w, 8);
        mp_str(w, "token_ids");
        mp_arr(w, (uint32_t)(n * bs));
        for (int i = 0; i < n * bs; i++) mp_uint(w, (uint64_t)i);
        mp_str(w, "block_hashes");
        mp_arr(w, (uint32_t)n);
        for (int i = 0; i < n; i++) mp_hash(w, ids[i], 1);
        mp_str(w, "parent_block_hash");
        if (parent >= 0) mp_hash(w, parent, 1);
        else mp_nil(w);
        mp_str(w, "block_size");
        mp_uint(w, (uint64_t)bs);
        mp_str(w, "lora_id");
        mp_nil(w);
        mp_str(w, "medium");
        mp_str(w, "GPU");
        mp_str(w, "lora_name");
        mp_nil(w);
        mp_str(w, "type"); /* the tag last: the reader must not need it first */
        mp_str(w, "BlockStored");
        return;
    }
    mp_arr(w, 8);
    mp_str(w, "BlockStored");
    mp_arr(w, (uint32_t)n);
    for (int i = 0; i < n; i++) mp_hash(w, ids[i], 0);
    if (parent >= 0) mp_hash(w, parent, 0);
    else mp_nil(w);
    mp_arr(w, (uint32_t)(n * bs));
    for (int i = 0; i < n * bs; i++) mp_uint(w, (uint64_t)i);
    mp_uint(w, (uint64_t)bs);
    mp_nil(w);
    mp_str(w, "GPU");
    mp_nil(w);
}

static void removed(wb *w, int map, const int *ids, int n) {
    if (map) {
        mp_map(w, 3);
        mp_str(w, "type");
        mp_str(w, "BlockRemoved");
        mp_str(w, "block_hashes");
        mp_arr(w, (uint32_t)n);
        for (int i = 0; i < n; i++) mp_hash(w, ids[i], 1);
        mp_str(w, "medium");
        mp_str(w, "GPU");
        return;
    }
    mp_arr(w, 3);
    mp_str(w, "BlockRemoved");
    mp_arr(w, (uint32_t)n);
    for (int i = 0; i < n; i++) mp_hash(w, ids[i], 0);
    mp_str(w, "GPU");
}

static void batch_head(wb *w, int map, double ts, int n_events) {
    w->n = 0;
    if (map) {
        mp_map(w, 2);
        mp_str(w, "events"); /* events before ts: allowed in a map */
    } else {
        mp_arr(w, 3);
        mp_f64(w, ts);
    }
    mp_arr(w, (uint32_t)n_events);
}
static void batch_tail(wb *w, int map, double ts) {
    if (map) {
        mp_str(w, "ts");
        mp_f64(w, ts);
    } else {
        mp_uint(w, 0); /* data_parallel_rank */
    }
}

/* chain 1-2-3, a branch 4-5 off 2, then 5 removed */
static size_t build_tree_batch(wb *w, int map) {
    int a[] = {1, 2, 3}, b[] = {4, 5}, r[] = {5};
    batch_head(w, map, 12.5, 3);
    stored(w, map, a, 3, -1, 16);
    stored(w, map, b, 2, 2, 16);
    removed(w, map, r, 1);
    batch_tail(w, map, 12.5);
    return w->n;
}

static void check_tree(kv_ptree *t) {
    kv_ptree_view v;
    kv_ptree_summarize(t, &v);
    CHECKF(v.resident == 4, "%d", v.resident);
    CHECK(v.tokens == 64);
    CHECK(v.roots == 1 && v.orphans == 0);
    CHECKF(v.leaves == 2 && v.branch_points == 1, "%d %d", v.leaves, v.branch_points);
    CHECKF(v.chain_blocks == 6, "%llu", (unsigned long long)v.chain_blocks); /* 1-2-3 and 1-2-4 */
    CHECK(v.shared == 2);
    CHECK(fabs(v.hit_potential - 1.0 / 3) < 1e-12);
    CHECK(v.max_depth == 3);
    CHECK(v.n_fam == 1 && v.fam[0].blocks == 4 && v.fam[0].leaves == 2 && v.fam[0].depth == 3 && v.fam[0].shared == 2);
    CHECK(v.n_cells == 4);
    CHECK((v.cell[0] & KV_PTREE_CELL_SHARED) && (v.cell[1] & KV_PTREE_CELL_SHARED) && !(v.cell[3] & KV_PTREE_CELL_SHARED));
    CHECK(v.c.stored == 5 && v.c.removed == 1 && v.c.events == 3 && v.c.batches == 1 && v.c.block_size == 16);
    CHECK(v.ev_n == 1 && v.ev[0].blocks == 1 && v.ev[0].known == 1 && v.ev[0].depth == 4 && v.ev[0].t == 12.5);
    CHECK(v.c.last_ts == 12.5);
}

static void test_msgpack_reader(void) {
    const uint8_t ints[] = {0x05, 0xff, 0xcc, 0xc8, 0xd0, 0x80, 0xd1, 0xff, 0x00, 0xcf, 0xff, 0xff, 0xff, 0xff,
                            0xff, 0xff, 0xff, 0xff, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0};
    kv_mp m = kv_mp_init(ints, sizeof ints);
    kv_mp_val v;
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.type == KV_MP_INT && v.i == 5);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.i == -1);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.i == 200);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.i == -128);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.i == -256);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.is_unsigned && v.u == UINT64_MAX);
    REQUIRE(kv_mp_read(&m, &v) == 0 && v.i == INT64_MIN && !v.is_unsigned);
    CHECK(kv_mp_read(&m, &v) == -1); /* at the end */
    const uint8_t f32[] = {0xca, 0x3f, 0xc0, 0, 0}, never[] = {0xc1}, cut[] = {0xda, 0x00, 0x05, 'a', 'b'};
    m = kv_mp_init(f32, sizeof f32);
    CHECK(kv_mp_read(&m, &v) == 0 && v.type == KV_MP_FLOAT && v.f == 1.5);
    m = kv_mp_init(never, 1);
    CHECK(kv_mp_read(&m, &v) == -1);
    m = kv_mp_init(cut, sizeof cut);
    CHECK(kv_mp_read(&m, &v) == -1 && m.p == cut); /* unchanged on error */
    uint8_t deep[64];
    memset(deep, 0x91, sizeof deep); /* [[[[...]]]] deeper than the cap */
    m = kv_mp_init(deep, sizeof deep);
    CHECK(kv_mp_skip(&m) == -1);
    const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}; /* 4G elements, one byte */
    m = kv_mp_init(huge, sizeof huge);
    CHECK(kv_mp_skip(&m) == -1);
}

static void test_array_layout(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 1024, NULL) == 0);
    static wb w;
    size_t n = build_tree_batch(&w, 0);
    kv_evbatch b;
    kv_err err;
    CHECKF(kv_evbatch_decode(w.b, n, NULL, NULL, &b, &err) == 0, "%s", err.msg);
    CHECK(b.n_events == 3 && b.n_stored == 2 && b.n_removed == 1 && b.dp_rank == 0 && !b.map_layout && b.ts == 12.5);
    CHECKF(kv_ptree_apply(&t, w.b, n, &err) == 0, "%s", err.msg);
    check_tree(&t);
    kv_ptree_free(&t);
}

static void test_map_layout(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 1024, NULL) == 0);
    static wb w;
    size_t n = build_tree_batch(&w, 1);
    kv_evbatch b;
    kv_err err;
    CHECKF(kv_evbatch_decode(w.b, n, NULL, NULL, &b, &err) == 0, "%s", err.msg);
    CHECK(b.map_layout && b.dp_rank == -1 && b.ts == 12.5);
    CHECKF(kv_ptree_apply(&t, w.b, n, &err) == 0, "%s", err.msg);
    check_tree(&t);
    kv_ptree_free(&t);
}

/* A refused batch changes nothing: every proper prefix of a good batch, a
 * byte after it, and a bad field in its last event. */
static void test_refused_changes_nothing(void) {
    for (int map = 0; map < 2; map++) {
        kv_ptree t;
        REQUIRE(kv_ptree_init(&t, 1024, NULL) == 0);
        static wb w;
        size_t n = build_tree_batch(&w, map);
        int refused = 0;
        for (size_t k = 0; k < n; k++) refused += kv_ptree_apply(&t, w.b, k, NULL) != 0;
        CHECKF(refused == (int)n, "map %d: %d of %zu prefixes refused", map, refused, n);
        w.b[n] = 0x00;
        CHECK(kv_ptree_apply(&t, w.b, n + 1, NULL) == KV_ERR_FORMAT);
        CHECK(strstr(t.last_error, "bytes after the batch") != NULL);
        kv_ptree_view v;
        kv_ptree_summarize(&t, &v);
        CHECK(v.resident == 0 && v.c.stored == 0 && v.c.events == 0 && v.c.batches == 0 && v.ev_n == 0);
        CHECK(v.c.rejected == (uint64_t)n + 1);
        /* good stores first, then a block_size that is a string */
        int a[] = {7, 8};
        batch_head(&w, 0, 1, 2);
        stored(&w, 0, a, 2, -1, 16);
        size_t at = w.n;
        stored(&w, 0, a, 1, -1, 16);
        batch_tail(&w, 0, 1);
        /* the second event's block_size (after its tokens) becomes "x" */
        uint8_t *bs = memchr(w.b + at + 12 + 16, 16, w.n - at - 28);
        REQUIRE(bs != NULL);
        memmove(bs + 2, bs + 1, w.n - (size_t)(bs + 1 - w.b));
        bs[0] = 0xa1;
        bs[1] = 'x';
        w.n++;
        kv_err err;
        CHECK(kv_ptree_apply(&t, w.b, w.n, &err) == KV_ERR_FORMAT);
        CHECKF(strstr(err.msg, "block_size") != NULL, "%s", err.msg);
        kv_ptree_summarize(&t, &v);
        CHECK(v.resident == 0 && v.c.stored == 0);
        kv_ptree_free(&t);
    }
}

static void test_cleared_unknown_orphans(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 1024, NULL) == 0);
    static wb w;
    int a[] = {1, 2}, b[] = {30}, gone[] = {99};
    batch_head(&w, 0, 2, 4);
    stored(&w, 0, a, 2, -1, 16);
    stored(&w, 0, b, 1, 77, 16); /* its parent was never seen: an orphan root */
    removed(&w, 0, gone, 1);     /* a block never seen */
    mp_arr(&w, 2);               /* a future event kind: skipped, counted */
    mp_str(&w, "BlockMoved");
    mp_uint(&w, 3);
    batch_tail(&w, 0, 2);
    kv_err err;
    CHECKF(kv_ptree_apply(&t, w.b, w.n, &err) == 0, "%s", err.msg);
    kv_ptree_view v;
    kv_ptree_summarize(&t, &v);
    CHECK(v.resident == 3 && v.roots == 2 && v.orphans == 1 && v.n_fam == 2 && v.fam[0].blocks == 2);
    CHECK(v.c.removed_unknown == 1 && v.c.removed == 0 && v.c.unknown_events == 1);
    CHECK(v.ev_n == 1 && v.ev[0].known == 0 && v.ev[0].depth == 0);
    batch_head(&w, 0, 3, 1);
    mp_arr(&w, 1);
    mp_str(&w, "AllBlocksCleared");
    batch_tail(&w, 0, 3);
    CHECK(kv_ptree_apply(&t, w.b, w.n, NULL) == 0);
    kv_ptree_summarize(&t, &v);
    CHECK(v.resident == 0 && v.c.cleared == 1 && v.c.batches == 2);
    kv_ptree_free(&t);
}

static void test_seq_gaps(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 16, NULL) == 0);
    CHECK(kv_ptree_seq(&t, 0) == 0 && kv_ptree_seq(&t, 1) == 0 && kv_ptree_seq(&t, 2) == 0);
    CHECK(kv_ptree_seq(&t, 5) == 2);
    CHECK(kv_ptree_seq(&t, 0) == 0); /* the publisher restarted */
    CHECK(t.c.seq_gaps == 1 && t.c.missed == 2 && t.c.last_seq == 0);
    kv_ptree_free(&t);
}

/* A names B as parent and B names A: summarising ends, the cycle is cut. */
static void test_hostile_cycle_and_full(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 4, NULL) == 0);
    static wb w;
    int a[] = {1}, b[] = {2}, many[] = {10, 11, 12, 13, 14};
    batch_head(&w, 0, 1, 2);
    stored(&w, 0, a, 1, 2, 16);
    stored(&w, 0, b, 1, 1, 16);
    batch_tail(&w, 0, 1);
    CHECK(kv_ptree_apply(&t, w.b, w.n, NULL) == 0);
    kv_ptree_view v;
    kv_ptree_summarize(&t, &v);
    CHECK(v.resident == 2 && v.roots == 1 && v.max_depth == 2 && v.n_cells == 2);
    batch_head(&w, 0, 2, 1);
    stored(&w, 0, many, 5, -1, 16);
    batch_tail(&w, 0, 2);
    CHECK(kv_ptree_apply(&t, w.b, w.n, NULL) == 0);
    kv_ptree_summarize(&t, &v);
    CHECK(v.resident == 4 && v.c.dropped_full == 3);
    kv_ptree_free(&t);
}

/* Inserts and removals at random against a plain set: the table's
 * backward-shift deletion keeps every key findable. */
static void test_table_against_set(void) {
    kv_ptree t;
    REQUIRE(kv_ptree_init(&t, 300, NULL) == 0);
    static wb w;
    int in[256] = {0}, n_in = 0;
    uint64_t rng = 12345;
    for (int step = 0; step < 3000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int id = (int)((rng >> 33) % 256), add = (rng >> 20) & 1;
        int ids[1] = {id};
        batch_head(&w, 0, step, 1);
        if (add) stored(&w, 0, ids, 1, -1, 16);
        else removed(&w, 0, ids, 1);
        batch_tail(&w, 0, step);
        REQUIRE(kv_ptree_apply(&t, w.b, w.n, NULL) == 0);
        if (add && !in[id]) n_in++;
        if (!add && in[id]) n_in--;
        in[id] = add;
    }
    CHECKF((int)t.n == n_in, "%u vs %d", t.n, n_in);
    int wrong = 0;
    for (int id = 0; id < 256; id++) {
        kv_blockkey k = {{0}, 8, 1, 0, 0};
        uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)id;
        for (int i = 0; i < 8; i++) k.b[i] = (uint8_t)(x >> (56 - 8 * i));
        wrong += (kv_ptree_find(&t, &k) != NULL) != in[id];
    }
    CHECK(wrong == 0);
    kv_ptree_free(&t);
}

TEST_MAIN(T(test_msgpack_reader), T(test_array_layout), T(test_map_layout), T(test_refused_changes_nothing),
          T(test_cleared_unknown_orphans), T(test_seq_gaps), T(test_hostile_cycle_and_full), T(test_table_against_set))
