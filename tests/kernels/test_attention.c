/* test_attention.c - the KV row formats (f16, int8, int8_asym, OCP fp8
 * e4m3/e5m2: names, sizes, exhaustive fp8 rounding, row error bounds) and
 * the CPU paged attention against a plain contiguous scalar reference on
 * fresh random data: several sequences of different lengths in shuffled
 * physical blocks, prefill chunks mixed with decode tokens (interleaved, or
 * each chunk contiguous as the scheduler lays them out, which the kernel
 * runs as multi-token work items), GQA ratios 1, 3, 4, 8, head_dim 8..128,
 * block sizes 1/16/32, every dtype, every ISA, 1 and 2 threads, driven
 * through the backend table; every token also alone (bit-identical), and 1
 * vs 2 threads bit-identical. Also prints the decode and prefill attention
 * times of the 110M shape. */
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
#include "../../kernels/membw.h"
#include "../../kernels/types.h"

static uint64_t rng_state = 0x5eed;

static uint64_t rnd64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rnd(int n) { return (int)(rnd64() % (uint64_t)n); }
static float frand(void) { return (float)((double)(rnd64() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* ---- formats ---- */

static void test_dtype_names_sizes(void) {
    for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++) {
        kv_cache_dtype back;
        CHECK(kv_cache_dtype_from_name(kv_cache_dtype_name((kv_cache_dtype)d), &back) == 0 && (int)back == d);
    }
    kv_cache_dtype d = KV_CACHE_F32;
    CHECK(kv_cache_dtype_from_name("FP8_E5M2", &d) == 0 && d == KV_CACHE_FP8_E5M2);
    CHECK(kv_cache_dtype_from_name("fp8", &d) == 0 && d == KV_CACHE_FP8_E4M3);
    CHECK(kv_cache_dtype_from_name("f8", &d) == -1 && d == KV_CACHE_FP8_E4M3);
    CHECK(kv_cache_dtype_from_name(NULL, &d) == -1);
    CHECK(!strcmp(kv_cache_dtype_name((kv_cache_dtype)42), "unknown"));
    CHECK(kv_cache_row_bytes(KV_CACHE_F32, 64) == 256);
    CHECK(kv_cache_row_bytes(KV_CACHE_F16, 64) == 128);
    CHECK(kv_cache_row_bytes(KV_CACHE_INT8, 64) == 68);
    CHECK(kv_cache_row_bytes(KV_CACHE_INT8_ASYM, 64) == 72);
    CHECK(kv_cache_row_bytes(KV_CACHE_FP8_E4M3, 64) == 68);
    CHECK(kv_cache_row_bytes(KV_CACHE_FP8_E5M2, 128) == 132);
    CHECK(kv_cache_row_bytes(KV_CACHE_F16, 0) == 0);
    CHECK(kv_cache_row_bytes((kv_cache_dtype)9, 64) == 0);
}

typedef uint8_t (*fp8_enc)(float);
typedef float (*fp8_dec)(uint8_t);

/* Exhaustive over the codes: every finite code round-trips; every midpoint
 * between neighbours rounds to the even code, and just off the midpoint to
 * the nearer one; beyond the largest finite value saturates. */
static void check_fp8(fp8_enc enc, fp8_dec dec, uint8_t max_code, float max_val, int ieee) {
    CHECK(dec(max_code) == max_val);
    CHECK(enc(max_val) == max_code && enc(-max_val) == (0x80 | max_code));
    CHECK(enc(1e30f) == max_code && enc(-1e30f) == (0x80 | max_code));
    CHECK(enc(INFINITY) == max_code && enc(-INFINITY) == (0x80 | max_code));
    CHECK(isnan(dec(enc(NAN))));
    CHECK(enc(0.0f) == 0 && enc(-0.0f) == 0x80);
    CHECK(enc(1e-30f) == 0);
    for (int v = 0; v <= max_code; v++) {
        float f = dec((uint8_t)v);
        CHECKF(enc(f) == v, "code %#x -> %g -> %#x", v, f, enc(f));
        CHECKF(enc(-f) == (0x80 | v), "code -%#x", v);
        CHECK(dec((uint8_t)(0x80 | v)) == -f);
        if (v == max_code) continue;
        float g = dec((uint8_t)(v + 1));
        CHECK(g > f);
        float mid = (f + g) * 0.5f; /* exact: the codes have few mantissa bits */
        int even = (v & 1) ? v + 1 : v;
        CHECKF(enc(mid) == even, "mid of %#x: %#x", v, enc(mid));
        CHECK(enc(nextafterf(mid, 0.0f)) == v);
        CHECK(enc(nextafterf(mid, INFINITY)) == v + 1);
    }
    if (ieee) CHECK(isinf(dec(0x7c)) && isnan(dec(0x7e)));
    else CHECK(isnan(dec(0x7f)) && isnan(dec(0xff)));
}

static void test_fp8_conversions(void) {
    check_fp8(kv_fp8_e4m3_from_fp32, kv_fp8_e4m3_to_fp32, 0x7e, KV_FP8_E4M3_MAX, 0);
    check_fp8(kv_fp8_e5m2_from_fp32, kv_fp8_e5m2_to_fp32, 0x7b, KV_FP8_E5M2_MAX, 1);
    /* spot values of the OCP tables */
    CHECK(kv_fp8_e4m3_to_fp32(0x38) == 1.0f && kv_fp8_e4m3_to_fp32(0x01) == ldexpf(1.0f, -9));
    CHECK(kv_fp8_e4m3_to_fp32(0x08) == ldexpf(1.0f, -6));
    CHECK(kv_fp8_e5m2_to_fp32(0x3c) == 1.0f && kv_fp8_e5m2_to_fp32(0x01) == ldexpf(1.0f, -16));
    /* e5m2 is the top byte of IEEE half: compare with the f16 conversion on
     * values exactly representable in e5m2 */
    for (int v = 0; v < 0x7c; v++) {
        float f = kv_fp8_e5m2_to_fp32((uint8_t)v);
        CHECK(kv_fp32_to_fp16(f) == (uint16_t)(v << 8));
    }
}

static float row_err(kv_cache_dtype d, const float *x, int n, float *maxabs_out) {
    uint8_t buf[4096 + 16];
    float y[4096];
    kv_dtype_encode_row(d, x, buf, n);
    kv_dtype_decode_row(d, buf, y, n);
    float e = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        e = fmaxf(e, fabsf(x[i] - y[i]));
        m = fmaxf(m, fabsf(x[i]));
    }
    if (maxabs_out) *maxabs_out = m;
    return e;
}

static void test_row_formats(void) {
    enum { N = 200 };
    float x[N], mn = 0, mx = 0, amax;
    for (int rep = 0; rep < 20; rep++) {
        float sc = ldexpf(1.0f, rnd(20) - 10);
        for (int i = 0; i < N; i++) x[i] = frand() * sc + (rep & 1 ? sc * 0.7f : 0.0f);
        mn = mx = x[0];
        for (int i = 1; i < N; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        CHECK(row_err(KV_CACHE_F32, x, N, NULL) == 0.0f);
        float e16 = row_err(KV_CACHE_F16, x, N, &amax);
        CHECK(e16 <= amax * 0x1p-11f);
        float e8 = row_err(KV_CACHE_INT8, x, N, &amax);
        CHECKF(e8 <= amax / 127.0f * 0.5f * 1.001f, "int8 err %g amax %g", e8, amax);
        float ea = row_err(KV_CACHE_INT8_ASYM, x, N, NULL);
        CHECKF(ea <= (mx - mn) / 255.0f * 0.5f * 1.001f + 1e-6f * amax, "int8_asym err %g", ea);
        /* fp8: relative half ulp for normal values, absolute for the rest */
        float e4 = row_err(KV_CACHE_FP8_E4M3, x, N, &amax);
        CHECKF(e4 <= amax * 0x1p-4f * 1.001f, "e4m3 err %g amax %g", e4, amax);
        float e5 = row_err(KV_CACHE_FP8_E5M2, x, N, &amax);
        CHECKF(e5 <= amax * 0x1p-3f * 1.001f, "e5m2 err %g amax %g", e5, amax);
        /* asymmetric beats symmetric on offset rows */
        if (rep & 1) CHECK(ea < e8);
    }
    /* f16 rows are the exact IEEE conversion */
    uint16_t h[N];
    kv_dtype_encode_row(KV_CACHE_F16, x, h, N);
    for (int i = 0; i < N; i++) CHECK(h[i] == kv_fp32_to_fp16(x[i]));
    /* an all-zero row: zero scale, zeros back */
    for (int d = KV_CACHE_INT8; d < KV_CACHE_DTYPE_COUNT; d++) {
        float z[16] = {0}, y[16];
        uint8_t buf[64];
        memset(buf, 0xff, sizeof buf);
        kv_dtype_encode_row((kv_cache_dtype)d, z, buf, 16);
        kv_dtype_decode_row((kv_cache_dtype)d, buf, y, 16);
        for (int i = 0; i < 16; i++) CHECK(y[i] == 0.0f);
    }
}

/* ---- attention ---- */

typedef struct attn_case {
    kv_cache_dtype dtype;
    int bs, hd, n_heads, n_kv, threads;
    kv_cpu_isa isa;
    int grouped; /* 1: each sequence's tokens contiguous in the batch (long chunks); 0: interleaved */
    int window;  /* > 0: the attention_window op (a token sees its last `window` positions) */
} attn_case;

/* The oracle: plain softmax attention over contiguous per-sequence K/V, in
 * double; a token at position p sees p0..p, p0 = p - window + 1 (window >
 * 0) or 0. kc/vc: (seq, pos, n_kv, hd). */
static void ref_attention(const float *q, const float *kc, const float *vc, int max_len, const int32_t *pos,
                          const int32_t *seq, int n_tokens, int n_heads, int n_kv, int hd, float scale, int window,
                          float *out) {
    const int group = n_heads / n_kv;
    double *sc = malloc(sizeof(double) * (size_t)max_len);
    for (int i = 0; i < n_tokens; i++)
        for (int h = 0; h < n_heads; h++) {
            const int g = h / group;
            const float *qh = q + ((size_t)i * n_heads + h) * hd;
            double m = -INFINITY, sum = 0.0;
            const int p0 = window > 0 ? KV_MAX(0, pos[i] - window + 1) : 0;
            for (int p = p0; p <= pos[i]; p++) {
                const float *k = kc + (((size_t)seq[i] * max_len + p) * n_kv + g) * hd;
                double d = 0.0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * k[e];
                sc[p] = d * scale;
                if (sc[p] > m) m = sc[p];
            }
            for (int p = p0; p <= pos[i]; p++) sum += (sc[p] = exp(sc[p] - m));
            for (int e = 0; e < hd; e++) {
                double acc = 0.0;
                for (int p = p0; p <= pos[i]; p++)
                    acc += sc[p] * vc[(((size_t)seq[i] * max_len + p) * n_kv + g) * hd + e];
                out[((size_t)i * n_heads + h) * hd + e] = (float)(acc / sum);
            }
        }
    free(sc);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Bound of the error against the original f32 K/V (the format's own error
 * comes on top of the kernel's). */
static double dtype_bound(kv_cache_dtype d) {
    switch (d) {
    case KV_CACHE_F32: return 2e-6;
    case KV_CACHE_F16: return 1e-3;
    case KV_CACHE_INT8: return 1.5e-2;
    case KV_CACHE_INT8_ASYM: return 1.5e-2;
    case KV_CACHE_FP8_E4M3: return 6e-2;
    case KV_CACHE_FP8_E5M2: return 1.2e-1;
    default: return 0;
    }
}

enum { NSEQ = 4 };

/* The token arrays of a kv_store / attention batch and where their K and V
 * rows come from: kc / vc hold every sequence's rows, (NSEQ, max_len, row). */
typedef struct token_rows {
    int32_t *pos, *seq, *slot;
    float *k, *v;
    const float *kc, *vc;
    const int32_t *const *tables; /* per sequence: logical -> physical block */
    int bs, max_len;
    size_t row; /* floats of a token's K (or V) row, all kv heads */
} token_rows;

/* Token i of the batch: position p of sequence s, its slot through the
 * block table, its K and V rows copied from the sequence's. */
static void put_token(const token_rows *tb, int i, int s, int p) {
    tb->pos[i] = p;
    tb->seq[i] = s;
    tb->slot[i] = tb->tables[s][p / tb->bs] * tb->bs + p % tb->bs;
    memcpy(tb->k + (size_t)i * tb->row, tb->kc + ((size_t)s * tb->max_len + p) * tb->row, sizeof(float) * tb->row);
    memcpy(tb->v + (size_t)i * tb->row, tb->vc + ((size_t)s * tb->max_len + p) * tb->row, sizeof(float) * tb->row);
}

/* Runs one configuration; returns 0 when skipped (ISA missing), 1 when run.
 * out_copy (may be NULL) receives a malloc'd copy of the batch's output and
 * *out_n its float count. */
static int run_case(const attn_case *tc, double *err_kernel, double *err_dtype, float **out_copy, size_t *out_n) {
    if (!kv_cpu_isa_supported(tc->isa)) return 0;
    kv_err err = {0};
    kv_backend *b = kv_backend_create("cpu", tc->threads, &err);
    if (!b) {
        CHECKF(0, "cpu backend: %s", err.msg);
        return 0;
    }
    CHECK(kv_cpu_set_isa(b, tc->isa) == 0);
    const int hd = tc->hd, nkv = tc->n_kv, nh = tc->n_heads, bs = tc->bs;
    /* sequence lengths (after this batch) and the batch: seq 0 a prefill
     * chunk of its last `chunk` positions, seq 1 a 2-token chunk
     * (speculative verify), the others one decode token each */
    int len[NSEQ] = {1 + rnd(70), 2 + rnd(40), 1, 20 + rnd(120)};
    /* grouped batches take longer chunks: more tokens than one work item
     * holds (16), and more rows than it holds (64) with GQA */
    int c0 = 1 + rnd(tc->grouped ? 48 : 24); /* (KV_MIN evaluates its arguments twice) */
    int chunk[NSEQ] = {KV_MIN(len[0], c0), 2, 1, 1};
    int max_len = 0, n_tokens = 0, n_blocks = 0;
    for (int s = 0; s < NSEQ; s++) {
        max_len = KV_MAX(max_len, len[s]);
        n_tokens += chunk[s];
        n_blocks += (len[s] + bs - 1) / bs;
    }
    n_blocks += 3; /* blocks nobody uses */
    kv_pages pg = {
        .dtype = tc->dtype,
        .n_layers = 2,
        .n_kv_heads = nkv,
        .head_dim = hd,
        .block_size = bs,
        .n_blocks = n_blocks,
    };
    kv_pages_set_sizes(&pg);
    pg.k = b->ops->alloc(b, pg.layer_bytes * 2);
    pg.v = b->ops->alloc(b, pg.layer_bytes * 2);
    /* shuffled physical blocks; the unused ones hold noise */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = rnd(i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < pg.layer_bytes * 2; i++) {
        pg.k[i] = (uint8_t)rnd64();
        pg.v[i] = (uint8_t)rnd64();
    }
    int32_t *tables[NSEQ];
    for (int s = 0, next = 0; s < NSEQ; s++) {
        int nb = (len[s] + bs - 1) / bs;
        tables[s] = malloc(sizeof(int32_t) * (size_t)nb);
        for (int i = 0; i < nb; i++) tables[s][i] = perm[next++];
    }
    size_t kvn = (size_t)NSEQ * max_len * nkv * hd;
    float *kc = malloc(sizeof(float) * kvn), *vc = malloc(sizeof(float) * kvn);
    float *kd = malloc(sizeof(float) * kvn), *vd = malloc(sizeof(float) * kvn);
    for (size_t i = 0; i < kvn; i++) {
        kc[i] = frand() * 2.0f;
        vc[i] = frand();
    }
    const int layer = 1;
    const int32_t *ctab[NSEQ] = {tables[0], tables[1], tables[2], tables[3]};
    /* history: every position before the batch, stored through kv_store in
     * one call per sequence */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(max_len + n_tokens));
    int32_t *sq = malloc(sizeof(int32_t) * (size_t)(max_len + n_tokens));
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)(max_len + n_tokens));
    float *kb = malloc(sizeof(float) * (size_t)(max_len + n_tokens) * nkv * hd);
    float *vb = malloc(sizeof(float) * (size_t)(max_len + n_tokens) * nkv * hd);
    const token_rows tb = {pos, sq, slot, kb, vb, kc, vc, ctab, bs, max_len, (size_t)nkv * hd};
    for (int s = 0; s < NSEQ; s++) {
        int n = len[s] - chunk[s];
        for (int p = 0; p < n; p++) {
            put_token(&tb, p, s, p);
        }
        kv_attn_batch hb = {.n_tokens = n, .pos = pos, .seq = sq, .slot = slot, .n_seqs = NSEQ, .tables = ctab};
        if (n) b->ops->kv_store(b, &pg, layer, &hb, kb, vb);
    }
    /* the batch: tokens of different sequences interleaved (or, grouped,
     * each sequence's tokens together in a random sequence order), each
     * sequence's own positions increasing */
    int next_pos[NSEQ], order[NSEQ] = {0, 1, 2, 3};
    for (int s = 0; s < NSEQ; s++) next_pos[s] = len[s] - chunk[s];
    for (int i = NSEQ - 1; i > 0; i--) {
        int k = rnd(i + 1), t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    for (int i = 0, o = 0; i < n_tokens; i++) {
        int s;
        if (tc->grouped) {
            while (next_pos[order[o]] == len[order[o]]) o++;
            s = order[o];
        } else {
            do s = rnd(NSEQ);
            while (next_pos[s] == len[s]);
        }
        put_token(&tb, i, s, next_pos[s]++);
    }
    kv_attn_batch ab = {.n_tokens = n_tokens, .pos = pos, .seq = sq, .slot = slot, .n_seqs = NSEQ, .tables = ctab};
    CHECKF(kv_attn_batch_check(&pg, &ab, nh, &err) == 0, "%s", err.msg);
    size_t qn = (size_t)n_tokens * nh * hd;
    float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn), *ref = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) {
        q[i] = frand();
        out[i] = NAN;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    b->ops->kv_store(b, &pg, layer, &ab, kb, vb);
    if (tc->window)
        b->ops->attention_window(b, &pg, layer, &ab, q, out, nh, scale, tc->window);
    else
        b->ops->attention(b, &pg, layer, &ab, q, out, nh, scale);
    /* batch invariance: each token computed alone gives the same bits (the
     * engine's greedy output must not depend on what else is batched) */
    for (int i = 0; i < n_tokens; i++) {
        float one[8 * 128];
        kv_attn_batch ai = {.n_tokens = 1, .pos = pos + i, .seq = sq + i, .slot = slot + i, .n_seqs = NSEQ,
                            .tables = ctab};
        if ((size_t)nh * hd > KV_ARRAY_LEN(one)) break;
        if (tc->window)
            b->ops->attention_window(b, &pg, layer, &ai, q + (size_t)i * nh * hd, one, nh, scale, tc->window);
        else
            b->ops->attention(b, &pg, layer, &ai, q + (size_t)i * nh * hd, one, nh, scale);
        if (memcmp(one, out + (size_t)i * nh * hd, sizeof(float) * nh * hd)) {
            CHECKF(0, "%s %s: token %d alone differs from the batch", kv_cpu_isa_name(tc->isa),
                   kv_cache_dtype_name(tc->dtype), i);
            break;
        }
    }

    /* what the cache holds, decoded: the kernel's own error */
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < len[s]; p++)
            for (int g = 0; g < nkv; g++) {
                size_t off = kv_pages_row_offset(&pg, layer, (int64_t)tables[s][p / bs] * bs + p % bs, g);
                size_t o = (((size_t)s * max_len + p) * nkv + g) * hd;
                kv_dtype_decode_row(tc->dtype, pg.k + off, kd + o, hd);
                kv_dtype_decode_row(tc->dtype, pg.v + off, vd + o, hd);
            }
    ref_attention(q, kd, vd, max_len, pos, sq, n_tokens, nh, nkv, hd, scale, tc->window, ref);
    *err_kernel = rel_l2(out, ref, qn);
    ref_attention(q, kc, vc, max_len, pos, sq, n_tokens, nh, nkv, hd, scale, tc->window, ref);
    *err_dtype = rel_l2(out, ref, qn);
    if (out_copy) {
        *out_copy = malloc(sizeof(float) * qn);
        if (*out_copy) memcpy(*out_copy, out, sizeof(float) * qn);
        *out_n = qn;
    }

    FREE_ALL(q, out, ref, pos, sq, slot, kb, vb, kc, vc, kd, vd);
    for (int s = 0; s < NSEQ; s++) free(tables[s]);
    free(perm);
    TEST_DEV_FREE(b, pg.k, pg.v);
    kv_backend_free(b);
    return 1;
}

static double worst_kernel[KV_CACHE_DTYPE_COUNT], worst_dtype[KV_CACHE_DTYPE_COUNT];

static void check_case(const attn_case *tc) {
    double ek = 0, ed = 0;
    if (!run_case(tc, &ek, &ed, NULL, NULL)) return;
    worst_kernel[tc->dtype] = fmax(worst_kernel[tc->dtype], ek);
    worst_dtype[tc->dtype] = fmax(worst_dtype[tc->dtype], ed);
    /* float accumulation + the polynomial exp against a double oracle (int8 queries: their rounding) */
    CHECKF(ek < (tc->dtype == KV_CACHE_INT8 && kv_attn_int8_integer(tc->isa) ? 5e-3 : 1e-6) && ed < dtype_bound(tc->dtype),
           "%s %s bs %d hd %d heads %d/%d threads %d%s: kernel err %.3g, vs f32 %.3g", kv_cpu_isa_name(tc->isa),
           kv_cache_dtype_name(tc->dtype), tc->bs, tc->hd, tc->n_heads, tc->n_kv, tc->threads,
           tc->grouped ? " grouped" : "", ek, ed);
}

/* Every GQA ratio x head_dim x block size, f32 and f16, best ISA, 1 and 2
 * threads, interleaved and grouped batches. */
static void test_attention_shapes(void) {
    static const int gqa[] = {1, 3, 4, 8}, hds[] = {8, 64, 128}, bss[] = {1, 16, 32};
    kv_cpu_isa best = kv_cpu_isa_best();
    for (int d = KV_CACHE_F32; d <= KV_CACHE_F16; d++)
        for (size_t g = 0; g < 4; g++)
            for (size_t h = 0; h < 3; h++)
                for (size_t s = 0; s < 3; s++) {
                    attn_case tc = {(kv_cache_dtype)d, bss[s], hds[h], 2 * gqa[g], 2, 1 + (int)((g + h + s) & 1), best,
                                    (int)((g + s) & 1), 0};
                    check_case(&tc);
                }
}

/* Every dtype on every ISA, including odd head sizes (SIMD tails) and a
 * group of 8 query heads (two passes of the 4-head kernels), interleaved
 * and grouped batches. */
static void test_attention_dtypes_isas(void) {
    static const attn_case shapes[] = {
        {0, 16, 64, 12, 12, 2, 0, 1, 0}, /* the 110M shape (MHA), chunks as the scheduler makes them */
        {0, 16, 64, 12, 12, 2, 0, 0, 0},
        {0, 16, 64, 9, 3, 1, 0, 1, 0},   /* SmolLM2: GQA 3 */
        {0, 32, 128, 8, 2, 2, 0, 0, 0},  /* GQA 4 */
        {0, 1, 20, 8, 1, 2, 0, 1, 0},    /* GQA 8, head_dim with a tail */
        {0, 16, 40, 4, 4, 1, 0, 0, 0},
        {0, 16, 36, 6, 2, 2, 0, 1, 0},
    };
    for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++)
        for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++)
            for (size_t s = 0; s < KV_ARRAY_LEN(shapes); s++) {
                attn_case tc = shapes[s];
                tc.dtype = (kv_cache_dtype)d;
                tc.isa = (kv_cpu_isa)isa;
                check_case(&tc);
            }
    for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++)
        printf("    %-9s worst normalised error: %.2e vs the decoded cache, %.2e vs f32 K/V (bound %.1e)\n",
               kv_cache_dtype_name((kv_cache_dtype)d), worst_kernel[d], worst_dtype[d],
               dtype_bound((kv_cache_dtype)d));
}

/* Sliding-window attention (attention_window) against the windowed oracle:
 * windows of 1 (a token sees only itself), shorter than a block, a few
 * blocks, and longer than every context (the same as plain attention), on
 * every ISA, f32 / f16 / int8 caches, interleaved and grouped batches, GQA
 * and MHA, 1 and 2 threads; blocks wholly before a window are skipped. */
static void test_attention_window(void) {
    static const int windows[] = {1, 5, 16, 37, 100000};
    static const kv_cache_dtype dts[] = {KV_CACHE_F32, KV_CACHE_F16, KV_CACHE_INT8};
    for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++)
        for (size_t w = 0; w < KV_ARRAY_LEN(windows); w++)
            for (size_t d = 0; d < KV_ARRAY_LEN(dts); d++) {
                attn_case tc = {dts[d], w & 1 ? 16 : 4, 64, w & 1 ? 8 : 4, 2, 1 + (int)(w & 1), (kv_cpu_isa)isa,
                                (int)((w + d) & 1), windows[w]};
                check_case(&tc);
            }
    /* the window really masks: window 1 differs from plain attention */
    attn_case a = {KV_CACHE_F32, 16, 64, 4, 2, 1, kv_cpu_isa_best(), 1, 0}, b = a;
    b.window = 3;
    uint64_t seed = rng_state;
    double e1, e2, d1, d2;
    float *o1 = NULL, *o2 = NULL;
    size_t n1 = 0, n2 = 0;
    int ran = run_case(&a, &e1, &d1, &o1, &n1);
    rng_state = seed;
    ran &= run_case(&b, &e2, &d2, &o2, &n2);
    CHECK(ran && n1 == n2 && o1 && o2 && memcmp(o1, o2, sizeof(float) * n1) != 0);
    free(o1);
    free(o2);
}

/* The same batch on 1 and 2 threads gives the same bits (the items, and
 * so each thread's share, depend on the thread count; a row's arithmetic
 * does not). */
static void test_attention_threads_agree(void) {
    for (int rep = 0; rep < 8; rep++) {
        uint64_t seed = rng_state;
        double e1, e2, d1, d2;
        float *o1 = NULL, *o2 = NULL;
        size_t n1 = 0, n2 = 0;
        attn_case tc = {rep & 2 ? KV_CACHE_INT8 : KV_CACHE_F16, 16, 64, rep & 4 ? 12 : 8, rep & 4 ? 12 : 2, 1,
                        kv_cpu_isa_best(), rep & 1, 0};
        run_case(&tc, &e1, &d1, &o1, &n1);
        rng_state = seed;
        tc.threads = 2;
        run_case(&tc, &e2, &d2, &o2, &n2);
        REQUIRE(o1 && o2);
        CHECKF(n1 == n2 && !memcmp(o1, o2, sizeof(float) * n1), "rep %d: 1 and 2 threads differ", rep);
        free(o1);
        free(o2);
    }
}

/* More work items than one dispatch takes (1024): 1500 decode tokens of
 * as many sequences, then the same with every sequence's tokens one chunk,
 * against the reference. */
static void test_attention_many_tokens(void) {
    enum { NS = 1500, NKV = 2, NH = 4, HD = 16, BS = 4, MAXLEN = 9 };
    kv_backend *b = kv_backend_create("cpu", 2, NULL);
    REQUIRE(b);
    kv_pages pg = {.dtype = KV_CACHE_F32, .n_layers = 1, .n_kv_heads = NKV, .head_dim = HD, .block_size = BS,
                   .n_blocks = NS * ((MAXLEN + BS - 1) / BS)};
    kv_pages_set_sizes(&pg);
    pg.k = b->ops->alloc(b, pg.layer_bytes);
    pg.v = b->ops->alloc(b, pg.layer_bytes);
    const int nbs = (MAXLEN + BS - 1) / BS;
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)pg.n_blocks);
    const int32_t **tabs = malloc(sizeof(int32_t *) * NS);
    for (int i = 0; i < pg.n_blocks; i++) tab[i] = pg.n_blocks - 1 - i;
    for (int s = 0; s < NS; s++) tabs[s] = tab + (size_t)s * nbs;
    const size_t kvn = (size_t)NS * MAXLEN * NKV * HD;
    float *kc = malloc(sizeof(float) * kvn), *vc = malloc(sizeof(float) * kvn);
    for (size_t i = 0; i < kvn; i++) {
        kc[i] = frand();
        vc[i] = frand();
    }
    int32_t *pos = malloc(sizeof(int32_t) * NS * MAXLEN), *sq = malloc(sizeof(int32_t) * NS * MAXLEN),
            *slot = malloc(sizeof(int32_t) * NS * MAXLEN);
    int len[NS];
    int n = 0;
    for (int s = 0; s < NS; s++) {
        len[s] = 1 + rnd(MAXLEN);
        for (int p = 0; p < len[s]; p++, n++) {
            pos[n] = p;
            sq[n] = s;
            slot[n] = tabs[s][p / BS] * BS + p % BS;
        }
    }
    /* (kc, vc) are laid out (seq, pos, head, dim); the store wants (token, head, dim) */
    float *kb = malloc(sizeof(float) * (size_t)n * NKV * HD), *vb = malloc(sizeof(float) * (size_t)n * NKV * HD);
    for (int i = 0; i < n; i++) {
        memcpy(kb + (size_t)i * NKV * HD, kc + ((size_t)sq[i] * MAXLEN + pos[i]) * NKV * HD, sizeof(float) * NKV * HD);
        memcpy(vb + (size_t)i * NKV * HD, vc + ((size_t)sq[i] * MAXLEN + pos[i]) * NKV * HD, sizeof(float) * NKV * HD);
    }
    kv_attn_batch all = {n, pos, sq, slot, NS, tabs};
    b->ops->kv_store(b, &pg, 0, &all, kb, vb);
    float *q = malloc(sizeof(float) * (size_t)n * NH * HD), *out = malloc(sizeof(float) * (size_t)n * NH * HD),
          *ref = malloc(sizeof(float) * (size_t)n * NH * HD);
    for (int i = 0; i < n * NH * HD; i++) q[i] = frand();
    /* every sequence's last token, one per sequence */
    int32_t *dpos = malloc(sizeof(int32_t) * NS), *dsq = malloc(sizeof(int32_t) * NS),
            *dslot = malloc(sizeof(int32_t) * NS);
    for (int s = 0; s < NS; s++) {
        dpos[s] = len[s] - 1;
        dsq[s] = s;
        dslot[s] = tabs[s][dpos[s] / BS] * BS + dpos[s] % BS;
    }
    kv_attn_batch dec = {NS, dpos, dsq, dslot, NS, tabs};
    b->ops->attention(b, &pg, 0, &dec, q, out, NH, 0.25f);
    ref_attention(q, kc, vc, MAXLEN, dpos, dsq, NS, NH, NKV, HD, 0.25f, 0, ref);
    double e = rel_l2(out, ref, (size_t)NS * NH * HD);
    CHECKF(e < 1e-6, "decode of %d sequences: err %.3g", NS, e);
    /* every token of every sequence: chunks */
    b->ops->attention(b, &pg, 0, &all, q, out, NH, 0.25f);
    ref_attention(q, kc, vc, MAXLEN, pos, sq, n, NH, NKV, HD, 0.25f, 0, ref);
    e = rel_l2(out, ref, (size_t)n * NH * HD);
    CHECKF(e < 1e-6, "%d tokens in chunks: err %.3g", n, e);
    FREE_ALL(q, out, ref, dpos, dsq, dslot, kb, vb, pos, sq, slot, kc, vc, tab, tabs);
    TEST_DEV_FREE(b, pg.k, pg.v);
    kv_backend_free(b);
}

static void test_batch_check(void) {
    kv_pages pg = {.dtype = KV_CACHE_F32, .n_layers = 1, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
                   .n_blocks = 3};
    int32_t t0[2] = {2, 0};
    const int32_t *tabs[1] = {t0};
    int32_t pos[1] = {5}, seq[1] = {0}, slot[1] = {0 * 4 + 1};
    kv_attn_batch ab = {.n_tokens = 1, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1, .tables = tabs};
    kv_err err = {0};
    CHECK(kv_attn_batch_check(&pg, &ab, 4, &err) == 0);
    CHECK(kv_attn_batch_check(&pg, &ab, 3, &err) == KV_ERR_INVAL && strstr(err.msg, "multiple"));
    slot[0] = 2;
    CHECK(kv_attn_batch_check(&pg, &ab, 4, &err) == KV_ERR_RANGE && strstr(err.msg, "slot"));
    slot[0] = 1;
    t0[0] = 3;
    CHECK(kv_attn_batch_check(&pg, &ab, 4, &err) == KV_ERR_RANGE && strstr(err.msg, "block"));
    t0[0] = 2;
    seq[0] = 1;
    CHECK(kv_attn_batch_check(&pg, &ab, 4, &err) == KV_ERR_RANGE && strstr(err.msg, "sequence"));
    seq[0] = 0;
    pos[0] = -1;
    CHECK(kv_attn_batch_check(&pg, &ab, 4, &err) == KV_ERR_RANGE && strstr(err.msg, "position"));
}

/* kv_store writes exactly the reference row encoding into each token's
 * slot (and nothing else), on every ISA, split over 2 threads. */
static void test_store_rows(void) {
    /* HD = 68: whole SIMD vectors and a tail. */
    enum { NT = 300, NKV = 4, HD = 68, BS = 16, NB = 24 };
    float *k = malloc(sizeof(float) * NT * NKV * HD), *v = malloc(sizeof(float) * NT * NKV * HD);
    int32_t pos[NT], seq[NT], slot[NT];
    for (int i = 0; i < NT * NKV * HD; i++) {
        k[i] = frand() * 3.0f;
        v[i] = frand();
    }
    /* Rows the encoders must treat exactly as the reference: all zeros, a
     * NaN, an infinity (in the vector part and in the tail), a huge value
     * next to tiny ones, and products landing exactly on .5. */
    memset(k, 0, sizeof(float) * HD);
    k[1 * HD + 5] = NAN;
    k[2 * HD + 66] = NAN;
    k[3 * HD + 9] = INFINITY;
    {   /* signalling NaNs, in a vector and in the tail: skipped by absmax like quiet ones */
        uint32_t snan = 0x7f800001u;
        memcpy(&k[7 * HD + 3], &snan, 4);
        memcpy(&v[7 * HD + 65], &snan, 4);
    }
    v[4 * HD + 67] = -INFINITY;
    for (int i = 0; i < HD; i++) k[5 * HD + i] = 1e-30f * (float)i;
    k[5 * HD + 3] = 1e30f;
    for (int i = 0; i < HD; i++) v[6 * HD + i] = (float)(i % 9) - 4.0f + 0.5f; /* absmax 4.5: x * 127/4.5 */
    v[6 * HD + 0] = 127.0f, v[6 * HD + 1] = 0.5f, v[6 * HD + 2] = -2.5f;       /* absmax 127: x * 1 */
    /* fp8 ties: a row whose absmax is the format's largest value is scaled
     * by exactly 1, so midpoints between neighbouring codes (normal and
     * subnormal) reach the rounding as they are. */
    for (int f = 0; f < 2; f++) {
        float *row = k + (size_t)(10 + f) * HD;
        row[0] = f ? KV_FP8_E5M2_MAX : KV_FP8_E4M3_MAX;
        for (int i = 1; i < HD; i++) {
            int c = rnd(f ? 0x7b : 0x7e);
            float a = f ? kv_fp8_e5m2_to_fp32((uint8_t)c) : kv_fp8_e4m3_to_fp32((uint8_t)c);
            float b = f ? kv_fp8_e5m2_to_fp32((uint8_t)(c + 1)) : kv_fp8_e4m3_to_fp32((uint8_t)(c + 1));
            row[i] = (i & 1 ? -0.5f : 0.5f) * (a + b);
        }
    }
    /* distinct slots in a shuffled order; slot -1 and one past the pool are skipped */
    for (int i = 0; i < NT; i++) slot[i] = i + 40;
    for (int i = NT - 1; i > 0; i--) {
        int j = rnd(i + 1), t = slot[i];
        slot[i] = slot[j];
        slot[j] = t;
    }
    slot[7] = -1;
    slot[8] = NB * BS;
    for (int i = 0; i < NT; i++) pos[i] = seq[i] = 0;
    kv_attn_batch ab = {.n_tokens = NT, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1};
    for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++)
        for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++) {
            if (!kv_cpu_isa_supported((kv_cpu_isa)isa)) continue;
            kv_backend *b = kv_backend_create("cpu", 2, NULL);
            REQUIRE(b);
            kv_cpu_set_isa(b, (kv_cpu_isa)isa);
            kv_pages pg = {.dtype = (kv_cache_dtype)d, .n_layers = 2, .n_kv_heads = NKV, .head_dim = HD,
                           .block_size = BS, .n_blocks = NB};
            kv_pages_set_sizes(&pg);
            pg.k = calloc(2, pg.layer_bytes);
            pg.v = calloc(2, pg.layer_bytes);
            uint8_t *want_k = calloc(2, pg.layer_bytes), *want_v = calloc(2, pg.layer_bytes);
            for (int i = 0; i < NT; i++) {
                if (slot[i] < 0 || slot[i] >= NB * BS) continue;
                for (int g = 0; g < NKV; g++) {
                    size_t off = kv_pages_row_offset(&pg, 1, slot[i], g);
                    kv_dtype_encode_row(pg.dtype, k + ((size_t)i * NKV + g) * HD, want_k + off, HD);
                    kv_dtype_encode_row(pg.dtype, v + ((size_t)i * NKV + g) * HD, want_v + off, HD);
                }
            }
            b->ops->kv_store(b, &pg, 1, &ab, k, v);
            CHECKF(!memcmp(pg.k, want_k, 2 * pg.layer_bytes) && !memcmp(pg.v, want_v, 2 * pg.layer_bytes),
                   "%s %s", kv_cpu_isa_name((kv_cpu_isa)isa), kv_cache_dtype_name(pg.dtype));
            FREE_ALL(pg.k, pg.v, want_k, want_v);
            kv_backend_free(b);
        }
    free(k);
    free(v);
}

/* copy_block copies every layer's K and V rows of one block, nothing else. */
static void test_copy_block(void) {
    kv_pages pg = {.dtype = KV_CACHE_F16, .n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .block_size = 4,
                   .n_blocks = 5};
    kv_pages_set_sizes(&pg);
    size_t n = pg.layer_bytes * 3;
    pg.k = malloc(n);
    pg.v = malloc(n);
    uint8_t *k0 = malloc(n), *v0 = malloc(n);
    for (size_t i = 0; i < n; i++) {
        pg.k[i] = (uint8_t)rnd64();
        pg.v[i] = (uint8_t)rnd64();
    }
    memcpy(k0, pg.k, n);
    memcpy(v0, pg.v, n);
    kv_cpu_copy_block(NULL, &pg, 3, 1);
    size_t bb = pg.slot_bytes * 4;
    for (size_t i = 0; i < n; i++) {
        size_t l = i / pg.layer_bytes, blk = (i % pg.layer_bytes) / bb, o = i % bb;
        uint8_t ek = blk == 3 ? k0[l * pg.layer_bytes + 1 * bb + o] : k0[i];
        uint8_t ev = blk == 3 ? v0[l * pg.layer_bytes + 1 * bb + o] : v0[i];
        if (pg.k[i] != ek || pg.v[i] != ev) {
            CHECKF(0, "byte %zu (layer %zu block %zu)", i, l, blk);
            break;
        }
    }
    kv_cpu_copy_block(NULL, &pg, 9, 1); /* out of range: nothing */
    kv_cpu_copy_block(NULL, &pg, 1, -1);
    FREE_ALL(pg.k, pg.v, k0, v0);
}

/* Decode attention of the 110M shape: 32 sequences x 512 context, 12 heads
 * of 64, block 16, in shuffled blocks as a busy cache hands them out, every
 * dtype, the best ISA; then a 128-token prefill chunk. Printed next to the
 * memory bandwidth (decode streams K/V from DRAM), not asserted. */
static void test_attention_decode_timing(void) {
    const int ns = 32, ctx = 512, nh = 12, hd = 64, bs = 16;
    const int isa = kv_cpu_isa_best();
    printf("    memory read bandwidth now: %.1f GB/s (1 thread)\n", kv_membw_measure_gbs(NULL, 0, 3));
    for (int threads = 1; threads <= 2; threads++)
        for (int d = 0; d < KV_CACHE_DTYPE_COUNT; d++) {
            kv_backend *b = kv_backend_create("cpu", threads, NULL);
            REQUIRE(b);
            kv_cpu_set_isa(b, (kv_cpu_isa)isa);
            kv_pages pg = {.dtype = (kv_cache_dtype)d, .n_layers = 1, .n_kv_heads = nh, .head_dim = hd,
                           .block_size = bs, .n_blocks = ns * ctx / bs};
            kv_pages_set_sizes(&pg);
            pg.k = b->ops->alloc(b, pg.layer_bytes);
            pg.v = b->ops->alloc(b, pg.layer_bytes);
            REQUIRE(pg.k && pg.v);
            /* fill through kv_store: random rows, one sequence at a time */
            float *kv = malloc(sizeof(float) * (size_t)ctx * nh * hd);
            int32_t *pos = malloc(sizeof(int32_t) * ctx), *sq = malloc(sizeof(int32_t) * ctx),
                    *slot = malloc(sizeof(int32_t) * ctx);
            int32_t *tab = malloc(sizeof(int32_t) * (size_t)pg.n_blocks);
            const int32_t **tabs = malloc(sizeof(int32_t *) * ns);
            for (int i = 0; i < pg.n_blocks; i++) tab[i] = i;
            for (int i = pg.n_blocks - 1; i > 0; i--) {
                int k = rnd(i + 1), t = tab[i];
                tab[i] = tab[k];
                tab[k] = t;
            }
            for (int s = 0; s < ns; s++) tabs[s] = tab + s * (ctx / bs);
            for (int i = 0; i < ctx * nh * hd; i++) kv[i] = frand();
            for (int s = 0; s < ns; s++) {
                for (int p = 0; p < ctx; p++) {
                    pos[p] = p;
                    sq[p] = s;
                    slot[p] = tabs[s][p / bs] * bs + p % bs;
                }
                kv_attn_batch hb = {ctx, pos, sq, slot, ns, tabs};
                b->ops->kv_store(b, &pg, 0, &hb, kv, kv);
            }
            int32_t dpos[32], dseq[32], dslot[32];
            for (int s = 0; s < ns; s++) {
                dpos[s] = ctx - 1;
                dseq[s] = s;
                dslot[s] = tabs[s][(ctx - 1) / bs] * bs + (ctx - 1) % bs;
            }
            kv_attn_batch ab = {ns, dpos, dseq, dslot, ns, tabs};
            float *q = malloc(sizeof(float) * ns * nh * hd), *out = malloc(sizeof(float) * ns * nh * hd);
            for (int i = 0; i < ns * nh * hd; i++) q[i] = frand();
            b->ops->attention(b, &pg, 0, &ab, q, out, nh, 0.125f); /* warm up */
            /* best of a few runs: the machine may be shared */
            const int reps = 6;
            double ms = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = kv_now_s();
                b->ops->attention(b, &pg, 0, &ab, q, out, nh, 0.125f);
                ms = fmin(ms, (kv_now_s() - t0) * 1e3);
            }
            double gbs = (double)pg.layer_bytes * 2 / (ms * 1e-3) / 1e9;
            /* a 128-token prefill chunk of one sequence (positions 0..127),
             * its K/V in the cache already */
            enum { PC = 128 };
            for (int p = 0; p < PC; p++) {
                pos[p] = p;
                sq[p] = 0;
                slot[p] = tabs[0][p / bs] * bs + p % bs;
            }
            kv_attn_batch pb = {PC, pos, sq, slot, ns, tabs};
            float *pq = malloc(sizeof(float) * PC * nh * hd), *pout = malloc(sizeof(float) * PC * nh * hd);
            for (int i = 0; i < PC * nh * hd; i++) pq[i] = frand();
            double pms = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = kv_now_s();
                b->ops->attention(b, &pg, 0, &pb, pq, pout, nh, 0.125f);
                pms = fmin(pms, (kv_now_s() - t0) * 1e3);
            }
            printf("    32 x 512 decode, %-9s %-6s %d thread%s: %6.3f ms/layer (%5.1f GB/s of K/V); "
                   "128-token prefill %6.3f ms/layer\n",
                   kv_cache_dtype_name(pg.dtype), kv_cpu_isa_name((kv_cpu_isa)isa), threads, threads > 1 ? "s" : " ",
                   ms, gbs, pms);
            CHECK(isfinite(out[0]) && isfinite(pout[0]));
            FREE_ALL(pq, pout, q, out, kv, pos, sq, slot, tab, tabs);
            TEST_DEV_FREE(b, pg.k, pg.v);
            kv_backend_free(b);
        }
}

TEST_MAIN(T(test_dtype_names_sizes), T(test_fp8_conversions), T(test_row_formats), T(test_batch_check),
          T(test_store_rows), T(test_copy_block), T(test_attention_shapes), T(test_attention_dtypes_isas),
          T(test_attention_threads_agree), T(test_attention_window), T(test_attention_many_tokens), T(test_attention_decode_timing))
