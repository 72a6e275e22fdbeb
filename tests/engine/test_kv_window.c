/* test_kv_window.c - sliding-window release in the paged block manager
 * (engine/kv_cache_window.c): the local layers' parts of blocks wholly
 * before every holder's window are released and counted; prefix sharing
 * attaches only blocks whose parts the new window needs (refcounted by
 * lneed); copy-on-write copies the part; a rejected draft rolled back by
 * truncate releases nothing the window still needs; swap moves parts only
 * where they exist; capacity and the sizes count both pools. A randomised
 * workload (shared prefixes, chunked prefill, speculative rollback,
 * preemption by release and swap, cache pressure on both pools) runs
 * kv_cache_check after every operation and reads back every row a query
 * may still attend to: global layers for every committed position, local
 * layers for the window. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../engine/kv_cache.h"
#include "../kv_cache_helpers.h"
#include "../../kernels/cpu_attention.h"

enum { NL = 3 }; /* layers 0 and 2 local, 1 global */
static const uint8_t local_layers[NL] = {1, 0, 1};

static kv_backend *cpu(void) {
    kv_err err = {0};
    kv_backend *b = kv_backend_create("cpu", 1, &err);
    if (!b) fprintf(stderr, "  cpu backend: %s\n", err.msg);
    return b;
}

static kv_cache_params wparams(int bs, int n_blocks, int n_local, int window) {
    kv_cache_params p = {.n_layers = NL, .n_kv_heads = 2, .head_dim = 4, .dtype = KV_CACHE_F32, .block_size = bs,
                         .n_blocks = n_blocks, .prefix_sharing = 1, .window = window, .local_layers = local_layers,
                         .n_local_blocks = n_local};
    return p;
}

/* A layer's pages, index in them and the slot of position p (as the
 * forward pass finds them). */
static kv_pages *layer_pages(kv_cache *c, const kv_seq *s, int l, int p, int *li, int32_t *slot) {
    int idx = 0;
    for (int k = 0; k < l; k++) idx += local_layers[k] == local_layers[l];
    *li = idx;
    *slot = local_layers[l] ? kv_cache_local_slot(c, s, p) : kv_cache_slot(c, s, p);
    return local_layers[l] ? kv_cache_local_pages(c) : kv_cache_pages(c);
}

/* Writes positions [p0, p1) of s in every layer; garbage != 0: noise. */
static void write_rows(kv_cache *c, const kv_seq *s, const uint64_t *ph, int p0, int p1, uint32_t garbage) {
    for (int p = p0; p < p1; p++)
        for (int l = 0; l < NL; l++) {
            int li;
            int32_t slot;
            kv_pages *pg = layer_pages(c, s, l, p, &li, &slot);
            CHECKF(slot >= 0, "seq %d pos %d layer %d: no slot to write", s->id, p, l);
            if (slot >= 0) kv_store_slot_rows(pg, li, l, slot, p, ph[p], garbage);
        }
}

/* 1 when every row s's next query may read holds its value: global layers
 * at every committed position, local layers inside the window. */
static int verify_rows(kv_cache *c, const kv_seq *s, const uint64_t *ph, int window) {
    for (int p = 0; p < s->n_tokens; p++)
        for (int l = 0; l < NL; l++) {
            if (local_layers[l] && p < s->n_tokens + 1 - window) continue;
            int li;
            int32_t slot;
            kv_pages *pg = layer_pages(c, s, l, p, &li, &slot);
            if (slot < 0) {
                fprintf(stderr, "  seq %d pos %d layer %d: no slot (released inside the window?)\n", s->id, p, l);
                return 0;
            }
            if (!kv_slot_rows_ok(pg, li, l, slot, ph[p], s->id, p)) return 0;
        }
    return 1;
}

static int prefill(kv_cache *c, kv_seq *s, const int32_t *toks, const uint64_t *ph, int n) {
    return kv_prefill_rows(c, s, toks, ph, n, write_rows);
}

/* ---- sizes ---- */

static void test_sizes(void) {
    kv_cache_params p = wparams(16, 100, 30, 64);
    const uint64_t full = kv_cache_block_bytes(&p); /* 2 * 3 layers * 16 * 2 heads * 4 * 4 bytes */
    CHECK(full == 2u * 3 * 16 * 2 * 4 * 4);
    CHECK(kv_cache_local_part_bytes(&p) == full / 3 * 2 && kv_cache_global_part_bytes(&p) == full / 3);
    CHECK(kv_cache_pool_bytes(&p) == full / 3 * 100 + full / 3 * 2 * 30);
    CHECK(kv_cache_params_windowed(&p));
    /* one 1000-token sequence whole, 3 more windows of 64 / 16 + 2 blocks */
    CHECK(kv_cache_plan_local_blocks(&p, 4, 1000) == 63 + 1 + 3 * 6);
    CHECK(kv_cache_plan_local_blocks(&p, 40, 1000) == 100); /* at most the blocks */
    kv_cache_params off = p;
    off.window = 0;
    CHECK(!kv_cache_params_windowed(&off) && kv_cache_local_part_bytes(&off) == 0);
    CHECK(kv_cache_pool_bytes(&off) == full * 100 && kv_cache_plan_local_blocks(&off, 4, 1000) == 0);
    /* Gemma 3 270M at 8K: 18 layers (15 local, window 512), 1 kv head of 256, f16, blocks of 16 */
    uint8_t g3[18];
    for (int l = 0; l < 18; l++) g3[l] = (l + 1) % 6 != 0;
    kv_cache_params gp = {.n_layers = 18, .n_kv_heads = 1, .head_dim = 256, .dtype = KV_CACHE_F16,
                          .block_size = 16, .n_blocks = 512, .window = 512, .local_layers = g3};
    gp.n_local_blocks = kv_cache_plan_local_blocks(&gp, 1, 8192);
    CHECK(kv_cache_global_part_bytes(&gp) == 3u * 16 * 1024 && kv_cache_local_part_bytes(&gp) == 15u * 16 * 1024);
    kv_backend *b = cpu();
    REQUIRE(b);
    p.window = -1;
    kv_err err = {0};
    CHECK(kv_cache_new(&p, b, &err) == NULL && strstr(err.msg, "window"));
    p = wparams(16, 10, 11, 64);
    CHECK(kv_cache_new(&p, b, &err) == NULL && strstr(err.msg, "n_local_blocks"));
    kv_backend_free(b);
}

/* ---- release, sharing, speculation, copy-on-write ---- */

static void test_release_and_share(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = wparams(4, 16, 16, 8); /* window 8 = 2 blocks */
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t t[40];
    uint64_t ph[40];
    for (int i = 0; i < 40; i++) t[i] = 100 + i;
    prefix_hashes(t, 40, ph);
    kv_seq a, s2;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    /* 12 tokens: the next query (position 12) sees 5..12: block 0 released */
    CHECK(prefill(c, &a, t, ph, 12) == 0);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    CHECK(a.lfloor == 1 && st.n_windowed == 1 && st.n_local_free == 16 - 2 && st.local_released == 1);
    kv_block_info map[16];
    kv_cache_block_map(c, map);
    CHECK(map[a.blocks[0]].windowed && !map[a.blocks[1]].windowed);
    CHECK(kv_cache_local_slot(c, &a, 0) == -1 && kv_cache_local_slot(c, &a, 4) >= 0);
    int32_t lt[8];
    kv_cache_local_table(c, &a, lt);
    CHECK(lt[0] == -1 && lt[1] >= 0 && lt[2] >= 0);
    /* a second prompt with the same 12 tokens and more: its window at 12
     * needs blocks 1 and 2, which still have their parts */
    CHECK(kv_cache_match_prefix(c, t, 17) == 12);
    CHECK(kv_cache_seq_attach_prefix(c, &s2, t, 17) == 12);
    CHECK(s2.lfloor == 1);
    kv_seq *live[] = {&a, &s2};
    CHECK(check_ok(c, live, 2));
    /* a speculative step: 1 token and 3 drafts reserved and written, the
     * drafts rejected: only the committed token moves the floor */
    CHECK(kv_cache_seq_reserve(c, &a, 4) == 0);
    write_rows(c, &a, ph, 12, 13, 0);
    write_rows(c, &a, ph, 13, 16, 0xbad0);
    kv_cache_seq_commit(c, &a, t, 13);
    kv_cache_seq_truncate(c, &a, 13);
    CHECK(a.lfloor == KV_MIN(1, (13 + 1 - 8) / 4) && check_ok(c, live, 2));
    /* a grows to 20 (floor 3): blocks 1 and 2 stay for s2, whose window needs them */
    CHECK(prefill(c, &a, t, ph, 20) == 0);
    CHECK(a.lfloor == 3 && verify_rows(c, &a, ph, 8) && verify_rows(c, &s2, ph, 8));
    kv_cache_get_stats(c, &st);
    CHECK(st.n_windowed == 1); /* block 0 only: s2 still covers 1 and 2 */
    CHECK(check_ok(c, live, 2));
    /* s2 computes on: its partial block 3 is private, then passes the window */
    CHECK(prefill(c, &s2, t, ph, 17) == 0);
    CHECK(s2.lfloor == 2 && verify_rows(c, &s2, ph, 8) && check_ok(c, live, 2));
    kv_cache_get_stats(c, &st);
    CHECK(st.n_windowed == 2); /* blocks 0 and 1 (shared, below both windows) */
    /* while a holds them without parts, a third prompt cannot reuse its
     * window's tail: the match stops where the window would need them */
    kv_seq s3;
    kv_seq_init(&s3, 3, 0);
    CHECK(kv_cache_match_prefix(c, t, 10) == 0);
    kv_cache_seq_release(c, &a);
    kv_cache_seq_release(c, &s2);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_get_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_local_cached > 0 && st.n_local_free + st.n_local_cached == 16);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* A prompt wholly in cached blocks attaches every block and copies the last
 * on write: the copy gets the local part's rows too. */
static void test_cow_copies_part(void) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = wparams(4, 16, 16, 6);
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    int32_t t[16];
    uint64_t ph[16];
    for (int i = 0; i < 16; i++) t[i] = 7 * i + 1;
    prefix_hashes(t, 16, ph);
    kv_seq a, s2;
    kv_seq_init(&a, 1, 0);
    kv_seq_init(&s2, 2, 0);
    CHECK(prefill(c, &a, t, ph, 12) == 0);
    kv_cache_seq_release(c, &a); /* 3 cached blocks, the last two with parts */
    CHECK(kv_cache_seq_attach_prefix(c, &s2, t, 12) == 11);
    kv_cache_stats st0, st;
    kv_cache_get_stats(c, &st0);
    CHECK(prefill(c, &s2, t, ph, 12) == 0);
    kv_cache_get_stats(c, &st);
    CHECK(st.cow_copies == st0.cow_copies + 1);
    CHECK(verify_rows(c, &s2, ph, 6));
    kv_seq *live[] = {&s2};
    CHECK(check_ok(c, live, 1));
    kv_cache_seq_release(c, &s2);
    kv_cache_free(c);
    kv_backend_free(b);
}

/* ---- the randomised workload ---- */

enum { W_SEQS = 8, W_MAXLEN = KV_WSEQ_CAP };

/* One step of q: a chunk of known tokens (or one new token) plus up to 3
 * drafts that are written and rejected. */
static int step(kv_cache *c, wseq *q, uint64_t *rs, int bs, int op, int *again) {
    if (q->s.n_tokens == q->len) {
        if (q->len == W_MAXLEN) return 1; /* done: release */
        q->t[q->len] = rnd(rs, 50);
        prefix_hashes(q->t, q->len + 1, q->ph);
        q->len++;
    }
    int chunk = 1 + rnd(rs, 3 * bs), draft = rnd(rs, 4);
    int n = KV_MIN(q->len - q->s.n_tokens, chunk);
    int spec = KV_MIN(draft, W_MAXLEN - q->s.n_tokens - n);
    int need = kv_cache_blocks_needed(c, &q->s, n + spec);
    int rc = kv_cache_seq_reserve(c, &q->s, n + spec);
    if (rc == KV_AGAIN) {
        CHECK(need > kv_cache_n_available(c));
        (*again)++;
        return 0;
    }
    CHECKF(rc == 0, "reserve rc %d", rc);
    if (rc) return 0;
    int n0 = q->s.n_tokens;
    write_rows(c, &q->s, q->ph, n0, n0 + n, 0);
    if (spec) write_rows(c, &q->s, q->ph, n0 + n, n0 + n + spec, 0xbad0 + (uint32_t)op);
    kv_cache_seq_commit(c, &q->s, q->t, n0 + n);
    kv_cache_seq_truncate(c, &q->s, n0 + n);
    return 0;
}

static void workload(int bs, int n_blocks, int n_local, int n_swap, int window, int n_ops, uint64_t seed) {
    kv_backend *b = cpu();
    REQUIRE(b);
    kv_cache_params p = wparams(bs, n_blocks, n_local, window);
    p.n_swap_blocks = n_swap;
    kv_cache *c = kv_cache_new(&p, b, NULL);
    REQUIRE(c);
    wseq *w = calloc(W_SEQS, sizeof *w);
    REQUIRE(w);
    int32_t pre[3][48];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 48; i++) pre[k][i] = 1000 * (k + 1) + i;
    uint64_t rs = seed;
    int next_id = 1, failed = 0, again = 0, hits = 0, swaps = 0;
    kv_seq *live[W_SEQS];
    for (int op = 0; op < n_ops && !failed; op++) {
        wseq *q = &w[rnd(&rs, W_SEQS)];
        int r = rnd(&rs, 100);
        if (!q->live) {
            kv_seq_init(&q->s, next_id++, 0);
            int k = rnd(&rs, 4);
            int plen = k < 3 ? rnd(&rs, 49) : 0;
            q->len = plen + 1 + rnd(&rs, 16);
            q->len = KV_MIN(q->len, W_MAXLEN);
            for (int i = 0; i < q->len; i++) q->t[i] = i < plen ? pre[k][i] : rnd(&rs, 50);
            prefix_hashes(q->t, q->len, q->ph);
            int m = kv_cache_match_prefix(c, q->t, q->len);
            int draw = 1 + rnd(&rs, 4 * bs), reuse = -1; /* (KV_MIN evaluates its arguments twice: draw first) */
            int first = KV_MIN(q->len, draw);
            int plan = kv_cache_blocks_to_admit(c, q->t, q->len, first, &reuse);
            int avail = kv_cache_n_available(c);
            int got = kv_cache_seq_attach_prefix(c, &q->s, q->t, q->len);
            CHECKF(got == m && reuse == m, "attach %d, match %d, planned reuse %d", got, m, reuse);
            int rc = first > got ? kv_cache_seq_reserve(c, &q->s, first - got) : 0;
            /* under release the plan is sufficient (the local pool may allow more) */
            if (plan <= avail) CHECKF(rc == 0, "admit plan %d blocks, %d available, reserve rc %d", plan, avail, rc);
            if (rc == 0 && first > got) {
                write_rows(c, &q->s, q->ph, got, first, 0);
                kv_cache_seq_commit(c, &q->s, q->t, first);
            }
            again += rc == KV_AGAIN;
            hits += got > 0;
            q->live = 1;
        } else if (q->s.swapped) {
            int rc = kv_cache_seq_swap_in(c, &q->s);
            again += rc == KV_AGAIN;
            swaps += rc == 0;
            if (r < 10) {
                kv_cache_seq_release(c, &q->s);
                q->live = 0;
            }
        } else if (r < 6) {
            kv_cache_seq_release(c, &q->s);
            q->live = 0;
        } else if (r < 12 && n_swap > 0) {
            again += kv_cache_seq_swap_out(c, &q->s) == KV_AGAIN;
        } else if (step(c, q, &rs, bs, op, &again)) {
            kv_cache_seq_release(c, &q->s);
            q->live = 0;
        }
        int nl = live_list(w, W_SEQS, live);
        if (!check_ok(c, live, nl)) {
            fprintf(stderr, "  after op %d\n", op);
            failed = 1;
        }
        for (int i = 0; i < W_SEQS && !failed; i++)
            if (w[i].live && !w[i].s.swapped && !verify_rows(c, &w[i].s, w[i].ph, window)) {
                fprintf(stderr, "  wrong K/V after op %d\n", op);
                failed = 1;
            }
    }
    CHECK(!failed);
    kv_cache_stats st;
    kv_cache_get_stats(c, &st);
    printf("    bs %d, %d blocks, %d local parts, window %d, swap %d: %d ops, %d hits, %d KV_AGAIN, %d swap in, "
           "%llu parts released, %llu reclaimed from the cache, %llu cow\n",
           bs, n_blocks, n_local, window, n_swap, n_ops, hits, again, swaps, (unsigned long long)st.local_released,
           (unsigned long long)st.local_reclaimed, (unsigned long long)st.cow_copies);
    CHECK(hits > 0 && again > 0 && st.local_released > 0);
    if (n_swap) CHECK(swaps > 0);
    for (int i = 0; i < W_SEQS; i++)
        if (w[i].live) kv_cache_seq_release(c, &w[i].s);
    CHECK(check_ok(c, NULL, 0));
    kv_cache_get_stats(c, &st);
    CHECK(st.n_used == 0 && st.n_local_free + st.n_local_cached == st.n_local_blocks);
    free(w);
    kv_cache_free(c);
    kv_backend_free(b);
}

static void test_workload_bs4(void) { workload(4, 64, 24, 24, 10, 20000, 1); }
static void test_workload_bs1(void) { workload(1, 160, 60, 60, 7, 10000, 2); }
static void test_workload_bs8_tight(void) { workload(8, 40, 12, 16, 17, 20000, 3); }
static void test_workload_no_swap(void) { workload(4, 48, 20, 0, 5, 10000, 4); }

TEST_MAIN(T(test_sizes), T(test_release_and_share), T(test_cow_copies_part), T(test_workload_bs4),
          T(test_workload_bs1), T(test_workload_bs8_tight), T(test_workload_no_swap))
