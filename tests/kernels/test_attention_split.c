/* test_attention_split.c - attention over long contexts split across
 * threads (kv_attn_run_split: each item's context cut into fixed chunks,
 * their softmax states merged after). On fresh random data with contexts
 * of 1..5 chunks (boundaries hit exactly, and one past), block sizes
 * 1/16/32, GQA and MHA, head_dims up to 256 that are and are not multiples of the
 * vector width, every dtype, every ISA, with and without a sliding window:
 *   - the split runs (the entry point says so) and gives the same bits as
 *     the unsplit path on one thread and on two, and as the cpu backend;
 *   - a token batched with a prefill chunk and other decode tokens (which
 *     the kernel runs unsplit, folding chunks inside its items) gives the
 *     same bits as alone;
 *   - the output against a double oracle over the decoded cache, by
 *     normalised error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend_helpers.h"
#include "../harness.h"
#include "../../kernels/cpu.h"
#include "../../kernels/cpu_attention.h"
#include "../../kernels/kv_dtype.h"
#include "../../kernels/threadpool.h"

static int rnd(int n) { return (int)(harness_rand64() % (uint64_t)n); }

enum { NSEQ = 3, PREFILL = 20 };

/* One random configuration: NSEQ sequences in shuffled physical blocks, the
 * cache filled through kv_store of backend b. */
typedef struct split_case {
    kv_cache_dtype dtype;
    kv_cpu_isa isa;
    int bs, hd, nh, nkv, window;
    int len[NSEQ];
    kv_pages pg;
    int32_t *tables[NSEQ];
    float *q; /* (NSEQ + PREFILL, nh, hd): the batch's queries */
} split_case;

static void case_setup(split_case *c, kv_backend *b) {
    const int bs = c->bs, hd = c->hd, nkv = c->nkv;
    int n_blocks = 2, max_len = 0;
    for (int s = 0; s < NSEQ; s++) {
        n_blocks += (c->len[s] + bs - 1) / bs;
        max_len = KV_MAX(max_len, c->len[s]);
    }
    c->pg = (kv_pages){.dtype = c->dtype, .n_layers = 1, .n_kv_heads = nkv, .head_dim = hd, .block_size = bs,
                       .n_blocks = n_blocks};
    kv_pages_set_sizes(&c->pg);
    c->pg.k = b->ops->alloc(b, c->pg.layer_bytes);
    c->pg.v = b->ops->alloc(b, c->pg.layer_bytes);
    memset(c->pg.k, 0x7b, c->pg.layer_bytes); /* unused blocks: noise that must not be read */
    memset(c->pg.v, 0x7b, c->pg.layer_bytes);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = rnd(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, next = 0; s < NSEQ; s++) {
        const int nb = (c->len[s] + bs - 1) / bs;
        c->tables[s] = malloc(sizeof(int32_t) * (size_t)nb);
        for (int i = 0; i < nb; i++) c->tables[s][i] = perm[next++];
    }
    free(perm);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)max_len), *sq = malloc(sizeof(int32_t) * (size_t)max_len);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)max_len);
    float *k = malloc(sizeof(float) * (size_t)max_len * nkv * hd), *v = malloc(sizeof(float) * (size_t)max_len * nkv * hd);
    for (int s = 0; s < NSEQ; s++) {
        for (int p = 0; p < c->len[s]; p++) {
            pos[p] = p;
            sq[p] = s;
            slot[p] = c->tables[s][p / bs] * bs + p % bs;
        }
        harness_fill_rand(k, (size_t)c->len[s] * nkv * hd, 2.0f);
        harness_fill_rand(v, (size_t)c->len[s] * nkv * hd, 1.0f);
        kv_attn_batch hb = {.n_tokens = c->len[s], .pos = pos, .seq = sq, .slot = slot, .n_seqs = NSEQ,
                            .tables = (const int32_t *const *)c->tables};
        b->ops->kv_store(b, &c->pg, 0, &hb, k, v);
    }
    FREE_ALL(pos, sq, slot, k, v);
    const size_t qn = (size_t)(NSEQ + PREFILL) * c->nh * hd;
    c->q = malloc(sizeof(float) * qn);
    harness_fill_rand(c->q, qn, 1.0f);
}

/* The oracle for token (s, p): softmax attention in double over the decoded
 * cache, positions p0..p (p0 from the window). */
static void oracle(const split_case *c, int s, int p, const float *q, float *out) {
    const int hd = c->hd, G = c->nh / c->nkv, bs = c->bs, p0 = c->window > 0 ? KV_MAX(0, p + 1 - c->window) : 0;
    float *kr = malloc(sizeof(float) * (size_t)hd), *vr = malloc(sizeof(float) * (size_t)hd);
    double *sc = malloc(sizeof(double) * (size_t)(p + 1)), *acc = malloc(sizeof(double) * (size_t)hd);
    for (int h = 0; h < c->nh; h++) {
        double m = -INFINITY, sum = 0.0;
        for (int t = p0; t <= p; t++) {
            const size_t off = kv_pages_row_offset(&c->pg, 0, (int64_t)c->tables[s][t / bs] * bs + t % bs, h / G);
            kv_dtype_decode_row(c->dtype, c->pg.k + off, kr, hd);
            double d = 0.0;
            for (int e = 0; e < hd; e++) d += (double)q[(size_t)h * hd + e] * kr[e];
            sc[t] = d / sqrt((double)hd);
            m = fmax(m, sc[t]);
        }
        memset(acc, 0, sizeof(double) * (size_t)hd);
        for (int t = p0; t <= p; t++) {
            const size_t off = kv_pages_row_offset(&c->pg, 0, (int64_t)c->tables[s][t / bs] * bs + t % bs, h / G);
            kv_dtype_decode_row(c->dtype, c->pg.v + off, vr, hd);
            const double w = exp(sc[t] - m);
            sum += w;
            for (int e = 0; e < hd; e++) acc[e] += w * vr[e];
        }
        for (int e = 0; e < hd; e++) out[(size_t)h * hd + e] = (float)(acc[e] / sum);
    }
    FREE_ALL(kr, vr, sc, acc);
}

/* The decode batch: the last position of each sequence (a batch of few
 * items, which the split takes). */
static kv_attn_batch decode_batch(const split_case *c, int32_t *pos, int32_t *sq, int32_t *slot) {
    for (int s = 0; s < NSEQ; s++) {
        pos[s] = c->len[s] - 1;
        sq[s] = s;
        slot[s] = c->tables[s][pos[s] / c->bs] * c->bs + pos[s] % c->bs;
    }
    return (kv_attn_batch){.n_tokens = NSEQ, .pos = pos, .seq = sq, .slot = slot, .n_seqs = NSEQ,
                           .tables = (const int32_t *const *)c->tables};
}

/* The same tokens after a PREFILL-token chunk of sequence 0's positions
 * before its last (many items: the kernel folds chunks inside each). */
static kv_attn_batch mixed_batch(const split_case *c, int32_t *pos, int32_t *sq, int32_t *slot) {
    const int n0 = KV_MIN(PREFILL, c->len[0] - 1);
    for (int i = 0; i < n0; i++) {
        pos[i] = c->len[0] - 1 - n0 + i;
        sq[i] = 0;
        slot[i] = c->tables[0][pos[i] / c->bs] * c->bs + pos[i] % c->bs;
    }
    decode_batch(c, pos + n0, sq + n0, slot + n0);
    return (kv_attn_batch){.n_tokens = n0 + NSEQ, .pos = pos, .seq = sq, .slot = slot, .n_seqs = NSEQ,
                           .tables = (const int32_t *const *)c->tables};
}

/* Runs one case; returns the worst normalised error against the oracle,
 * -1 when skipped. */
static double run_split_case(split_case *c, kv_threadpool *pool, float *part, size_t part_n) {
    if (!kv_cpu_isa_supported(c->isa)) return -1;
    kv_err err = {0};
    kv_backend *b = kv_backend_create("cpu", 2, &err);
    if (!b) {
        CHECKF(0, "cpu backend: %s", err.msg);
        return -1;
    }
    CHECK(kv_cpu_set_isa(b, c->isa) == 0);
    case_setup(c, b);
    const int hd = c->hd, nh = c->nh, rowf = nh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    int32_t pos[NSEQ + PREFILL], sq[NSEQ + PREFILL], slot[NSEQ + PREFILL];
    const size_t on = (size_t)(NSEQ + PREFILL) * rowf;
    float *o_split = malloc(sizeof(float) * on), *o_one = malloc(sizeof(float) * on);
    float *o_two = malloc(sizeof(float) * on), *o_be = malloc(sizeof(float) * on);
    float *o_mix = malloc(sizeof(float) * on), *qm = malloc(sizeof(float) * on), *ref = malloc(sizeof(float) * rowf);
    kv_attn_batch ab = decode_batch(c, pos, sq, slot);
    CHECKF(kv_attn_batch_check(&c->pg, &ab, nh, &err) == 0, "%s", err.msg);
    const int q0 = PREFILL * rowf; /* the decode tokens' queries follow the prefill chunk's */
    const int did = kv_attn_run_split(pool, c->isa, &c->pg, 0, &ab, c->q + q0, o_split, nh, scale, c->window, part,
                                      part_n);
    int longest = 0;
    for (int s = 0; s < NSEQ; s++) longest = KV_MAX(longest, c->len[s]);
    const int S = (512 + c->bs - 1) / c->bs * c->bs;
    /* the split takes batches of fewer items than 8 per thread */
    const int want = longest > S && c->nkv * NSEQ < 8 * 2;
    CHECKF(did == want, "split ran %d, longest context %d, chunk %d, %d kv heads", did, longest, S, c->nkv);
    CHECK(kv_attn_run_split(NULL, c->isa, &c->pg, 0, &ab, c->q + q0, o_one, nh, scale, c->window, part, part_n) == 0);
    CHECK(kv_attn_run_split(pool, c->isa, &c->pg, 0, &ab, c->q + q0, o_two, nh, scale, c->window, NULL, 0) == 0);
    if (c->window)
        b->ops->attention_window(b, &c->pg, 0, &ab, c->q + q0, o_be, nh, scale, c->window);
    else
        b->ops->attention(b, &c->pg, 0, &ab, c->q + q0, o_be, nh, scale);
    const size_t db = sizeof(float) * NSEQ * rowf;
    CHECKF(!memcmp(o_split, o_one, db), "split vs one thread unsplit differ");
    CHECKF(!memcmp(o_split, o_two, db), "split vs two threads unsplit differ");
    CHECKF(!memcmp(o_split, o_be, db), "split vs the cpu backend differ");
    /* the mixed batch: prefill queries first, then the decode tokens' */
    kv_attn_batch mb = mixed_batch(c, pos, sq, slot);
    const int n0 = mb.n_tokens - NSEQ;
    memcpy(qm, c->q + (size_t)(PREFILL - n0) * rowf, sizeof(float) * (size_t)mb.n_tokens * rowf);
    kv_attn_run_split(pool, c->isa, &c->pg, 0, &mb, qm, o_mix, nh, scale, c->window, part, part_n);
    CHECKF(!memcmp(o_mix + (size_t)n0 * rowf, o_split, db), "decode tokens batched with a prefill chunk differ");
    double worst = 0.0;
    for (int s = 0; s < NSEQ; s++) {
        oracle(c, s, c->len[s] - 1, c->q + q0 + (size_t)s * rowf, ref);
        worst = fmax(worst, harness_nerr(o_split + (size_t)s * rowf, ref, (size_t)rowf));
    }
    /* a prefill token too (folded inside a multi-token item) */
    oracle(c, 0, mb.pos[0], qm, ref);
    worst = fmax(worst, harness_nerr(o_mix, ref, (size_t)rowf));
    FREE_ALL(o_split, o_one, o_two, o_be, o_mix, qm, ref, c->q);
    for (int s = 0; s < NSEQ; s++) free(c->tables[s]);
    TEST_DEV_FREE(b, c->pg.k, c->pg.v);
    kv_backend_free(b);
    return worst;
}

/* Context lengths around chunk boundaries: exactly k chunks, one past,
 * one short, or anywhere up to 5 chunks. */
static int pick_len(int S) {
    const int k = 1 + rnd(4);
    switch (rnd(4)) {
    case 0: return k * S;
    case 1: return k * S + 1;
    case 2: return k * S - 1;
    default: return 1 + rnd(5 * S);
    }
}

static void test_split_matches(void) {
    /* the 8-kv-head shape has enough items unsplit: the split must not run */
    static const int shapes[][3] = {{64, 9, 3}, {72, 4, 1}, {32, 8, 8}, {128, 8, 2}, {256, 4, 1}};
    static const int sizes[] = {1, 16, 32};
    kv_threadpool *pool = kv_threadpool_new(2);
    REQUIRE(pool);
    const size_t part_n = 1u << 20;
    float *part = malloc(sizeof(float) * part_n);
    REQUIRE(part);
    double worst[KV_CACHE_DTYPE_COUNT] = {0};
    int ran = 0;
    for (int rep = 0; rep < 48; rep++) {
        const int *sh = shapes[rnd(KV_ARRAY_LEN(shapes))];
        split_case c = {.dtype = (kv_cache_dtype)(rep % KV_CACHE_DTYPE_COUNT),
                        .isa = (kv_cpu_isa)(rep / KV_CACHE_DTYPE_COUNT % KV_CPU_ISA_COUNT),
                        .bs = sizes[rnd(3)], .hd = sh[0], .nh = sh[1], .nkv = sh[2]};
        const int S = (512 + c.bs - 1) / c.bs * c.bs;
        for (int s = 0; s < NSEQ; s++) c.len[s] = pick_len(S);
        c.len[1] = KV_MAX(c.len[1], S + 1); /* one context that splits */
        if (rep % 5 == 4) c.window = S / 2 + rnd(2 * S);
        const double e = run_split_case(&c, pool, part, part_n);
        if (e < 0) continue;
        ran++;
        worst[c.dtype] = fmax(worst[c.dtype], e);
        const double bound = c.dtype == KV_CACHE_INT8 && kv_attn_int8_integer(c.isa) ? 5e-3 : 2e-6; /* int8 queries */
        CHECKF(e < bound, "%s %s bs %d hd %d heads %d/%d window %d: err %.3g vs the oracle", kv_cpu_isa_name(c.isa),
               kv_cache_dtype_name(c.dtype), c.bs, c.hd, c.nh, c.nkv, c.window, e);
    }
    CHECK(ran >= 12);
    for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++)
        printf("    %-9s worst normalised error of the split vs the oracle: %.2e\n",
               kv_cache_dtype_name((kv_cache_dtype)d), worst[d]);
    free(part);
    kv_threadpool_free(pool);
}

/* Too little part: the split does not run, and the bits are the same. */
static void test_split_needs_part(void) {
    kv_threadpool *pool = kv_threadpool_new(2);
    REQUIRE(pool);
    split_case c = {.dtype = KV_CACHE_F16, .isa = kv_cpu_isa_best(), .bs = 16, .hd = 64, .nh = 9, .nkv = 3,
                    .len = {1500, 1200, 700}};
    kv_backend *b = kv_backend_create("cpu", 1, NULL);
    REQUIRE(b);
    case_setup(&c, b);
    int32_t pos[NSEQ], sq[NSEQ], slot[NSEQ];
    kv_attn_batch ab = decode_batch(&c, pos, sq, slot);
    const size_t n = kv_attn_split_floats(&c.pg, NSEQ, c.nh, 1500);
    CHECK(n == (size_t)NSEQ * 9 * 3 * 66);
    CHECK(kv_attn_split_floats(&c.pg, 0, c.nh, 1500) == 0);
    float *part = malloc(sizeof(float) * n), *o1 = malloc(sizeof(float) * NSEQ * 9 * 64);
    float *o2 = malloc(sizeof(float) * NSEQ * 9 * 64);
    CHECK(kv_attn_run_split(pool, c.isa, &c.pg, 0, &ab, c.q, o1, c.nh, 0.125f, 0, part, n) == 1);
    CHECK(kv_attn_run_split(pool, c.isa, &c.pg, 0, &ab, c.q, o2, c.nh, 0.125f, 0, part, n - 1) == 0);
    CHECK(!memcmp(o1, o2, sizeof(float) * NSEQ * 9 * 64));
    FREE_ALL(part, o1, o2, c.q);
    for (int s = 0; s < NSEQ; s++) free(c.tables[s]);
    TEST_DEV_FREE(b, c.pg.k, c.pg.v);
    kv_backend_free(b);
    kv_threadpool_free(pool);
}

TEST_MAIN(T(test_split_matches), T(test_split_needs_part))
