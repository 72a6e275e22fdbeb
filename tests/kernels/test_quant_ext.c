/* test_quant_ext.c - Q5_0, Q5_1, Q8_1 and the K-quants: dequantizers against
 * an independent decoder written here from the GGUF layout (byte offsets,
 * not the structs), quantize round-trip error on fresh random data, every
 * SIMD dot against the scalar one and the scalar one against the
 * dequantized float dot, determinism, and bad-input behaviour.
 * KVTOP_SEED=N reproduces a run; KVTOP_QEXT_BENCH=1 adds the speed table. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/common.h"
#include "../../kernels/quant_ext.h"
#include "../harness.h"

/* ---- random numbers (splitmix64), fresh per run ---- */
static uint64_t rng_state;
static uint64_t rng_seed(void) {
    static uint64_t seed;
    if (!seed) {
        const char *s = getenv("KVTOP_SEED");
        seed = (s && *s) ? strtoull(s, NULL, 10) : kv_now_ns();
        if (!seed) seed = 1;
        rng_state = seed;
        printf("  seed %llu (KVTOP_SEED=%llu reproduces)\n", (unsigned long long)seed, (unsigned long long)seed);
    }
    return seed;
}
static uint64_t rnd(void) {
    rng_seed();
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float unif(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; } /* [-1, 1) */
/* Roughly Gaussian (sum of 4 uniforms), like trained weights, with a rare outlier. */
static float gauss(void) {
    float g = (unif() + unif() + unif() + unif()) * 0.866f;
    if ((rnd() & 255) == 0) g *= 4.f;
    return g;
}

static const kv_type new_types[] = {KV_TYPE_Q5_0, KV_TYPE_Q5_1, KV_TYPE_Q8_1, KV_TYPE_Q4_K,
                                    KV_TYPE_Q5_K, KV_TYPE_Q6_K, KV_TYPE_Q8_K};
#define N_TYPES ((int)(sizeof new_types / sizeof new_types[0]))

static size_t row_bytes(kv_type t, int64_t n) { return kv_type_row_size(t, n); }

/* ---- independent decoder: byte offsets from the GGUF block description ---- */
static float fp16_at(const uint8_t *p) { return kv_fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8))); }

/* 6-bit scale / min j of the 12 packed bytes (q4_K, q5_K). */
static void k_scale(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element e of the block at p. */
static float decode_elem(kv_type t, const uint8_t *p, int e) {
    switch (t) {
    case KV_TYPE_Q5_0: {
        uint32_t qh = (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
        int lo = e < 16 ? (p[6 + e] & 15) : (p[6 + e - 16] >> 4);
        int q = lo | (int)((qh >> e) & 1) << 4;
        return (float)(q - 16) * fp16_at(p);
    }
    case KV_TYPE_Q5_1: {
        uint32_t qh = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        int lo = e < 16 ? (p[8 + e] & 15) : (p[8 + e - 16] >> 4);
        int q = lo | (int)((qh >> e) & 1) << 4;
        return (float)q * fp16_at(p) + fp16_at(p + 2);
    }
    case KV_TYPE_Q8_1: return (float)(int8_t)p[4 + e] * fp16_at(p);
    case KV_TYPE_Q8_K: {
        float d;
        memcpy(&d, p, 4);
        return d * (float)(int8_t)p[4 + e];
    }
    case KV_TYPE_Q4_K:
    case KV_TYPE_Q5_K: {
        const int is5 = t == KV_TYPE_Q5_K;
        const uint8_t *scales = p + 4, *qh = p + 16, *qs = p + (is5 ? 48 : 16);
        int g = e / 64, l = e % 32, upper = (e % 64) >= 32;
        int q = upper ? (qs[32 * g + l] >> 4) : (qs[32 * g + l] & 15);
        if (is5) q |= ((qh[l] >> (2 * g + upper)) & 1) << 4;
        int sc, m;
        k_scale(scales, e / 32, &sc, &m);
        return (fp16_at(p) * (float)sc) * (float)q - fp16_at(p + 2) * (float)m;
    }
    case KV_TYPE_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
        int byte = ql[64 * h + l + (k & 1) * 32];
        int lo = k < 2 ? (byte & 15) : (byte >> 4);
        int hi = (qh[32 * h + l] >> (2 * k)) & 3;
        return (fp16_at(p + 208) * (float)sc[e / 16]) * (float)((lo | hi << 4) - 32);
    }
    default: return 0.f;
    }
}

/* Random block bytes with finite, moderate scales in every fp16/f32 slot. */
static void random_blocks(kv_type t, uint8_t *buf, int64_t n) {
    const kv_type_traits *tr = kv_type_get(t);
    const int64_t nb = n / tr->blck_size;
    for (size_t i = 0; i < nb * tr->type_size; i++) buf[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = buf + b * tr->type_size;
        uint16_t h1 = kv_fp32_to_fp16(unif() * 0.1f), h2 = kv_fp32_to_fp16(unif() * 0.1f);
        float f = unif() * 0.01f;
        switch (t) {
        case KV_TYPE_Q5_0: memcpy(p, &h1, 2); break;
        case KV_TYPE_Q5_1:
        case KV_TYPE_Q8_1:
        case KV_TYPE_Q4_K:
        case KV_TYPE_Q5_K: memcpy(p, &h1, 2); memcpy(p + 2, &h2, 2); break;
        case KV_TYPE_Q6_K: memcpy(p + 208, &h1, 2); break;
        case KV_TYPE_Q8_K:
            memcpy(p, &f, 4);
            for (int j = 0; j < 256; j++) /* keep quants in [-127, 127] and bsums consistent */
                if (p[4 + j] == 0x80) p[4 + j] = 0x81;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += (int8_t)p[4 + 16 * g + l];
                int16_t s16 = (int16_t)s;
                memcpy(p + 260 + 2 * g, &s16, 2);
            }
            break;
        default: break;
        }
    }
}

static void test_table(void) {
    CHECK(kv_qext_get(KV_TYPE_F32) == NULL);
    CHECK(kv_qext_get(KV_TYPE_Q4_0) == NULL);
    CHECK(kv_qext_get(KV_TYPE_Q8_0) == NULL);
    CHECK(kv_qext_get((kv_type)99) == NULL);
    for (int k = 0; k < N_TYPES; k++) {
        const kv_qext_ops *o = kv_qext_get(new_types[k]);
        REQUIRE(o);
        CHECK(o->type == new_types[k]);
        CHECK(o->blck_size == kv_type_get(o->type)->blck_size);
        CHECK(o->dequantize_row && o->quantize_row && o->quantize_act_row && o->vec_dot && o->vec_dot_ref);
        CHECK(o->vec_type == KV_TYPE_Q8_0 || o->vec_type == KV_TYPE_Q8_1 || o->vec_type == KV_TYPE_Q8_K);
        CHECK(kv_qext_vec_dot_isa(o->type, KV_QEXT_ISA_SCALAR) == o->vec_dot_ref);
        CHECK(kv_qext_vec_dot_isa(o->type, kv_qext_isa_best()) == o->vec_dot);
    }
    CHECK(kv_qext_get(KV_TYPE_Q5_0)->vec_type == KV_TYPE_Q8_0);
    CHECK(kv_qext_get(KV_TYPE_Q5_1)->vec_type == KV_TYPE_Q8_1);
    CHECK(kv_qext_get(KV_TYPE_Q4_K)->vec_type == KV_TYPE_Q8_K);
    /* sizes of a row agree with the GGUF block sizes */
    CHECK(row_bytes(KV_TYPE_Q5_0, 64) == 44 && row_bytes(KV_TYPE_Q5_1, 64) == 48);
    CHECK(row_bytes(KV_TYPE_Q4_K, 512) == 288 && row_bytes(KV_TYPE_Q5_K, 256) == 176);
    CHECK(row_bytes(KV_TYPE_Q6_K, 256) == 210 && row_bytes(KV_TYPE_Q8_K, 256) == 292);
    CHECK(row_bytes(KV_TYPE_Q4_K, 576) == 0); /* SmolLM2's rows do not fit K-quants */
    printf("  best isa: %s\n", kv_qext_isa_name(kv_qext_isa_best()));
}

static void test_init_marks_supported(void) {
    kv_qext_init();
    kv_qext_init(); /* idempotent */
    for (int k = 0; k < N_TYPES; k++) CHECKF(kv_type_get(new_types[k])->supported, "%s", kv_type_name(new_types[k]));
    CHECK(!kv_type_get(KV_TYPE_Q2_K)->supported);
}

static void test_dequant_matches_layout(void) {
    const int64_t n = 1024;
    uint8_t *buf = malloc(row_bytes(KV_TYPE_Q8_K, n));
    float *y = malloc(n * sizeof *y);
    REQUIRE(buf && y);
    for (int k = 0; k < N_TYPES; k++) {
        kv_type t = new_types[k];
        const kv_type_traits *tr = kv_type_get(t);
        for (int rep = 0; rep < 20; rep++) {
            random_blocks(t, buf, n);
            kv_qext_get(t)->dequantize_row(buf, y, n);
            int bad = 0;
            for (int64_t e = 0; e < n; e++) {
                const uint8_t *p = buf + (e / tr->blck_size) * tr->type_size;
                float want = decode_elem(t, p, (int)(e % tr->blck_size));
                if (memcmp(&want, &y[e], 4) != 0 && bad++ < 3)
                    fprintf(stderr, "  %s elem %lld: got %g want %g\n", tr->name, (long long)e, y[e], want);
            }
            CHECKF(bad == 0, "%s: %d elements differ from the layout decode", tr->name, bad);
        }
    }
    free(buf);
    free(y);
}

/* Normalised RMSE of a quantize -> dequantize round trip. */
static double roundtrip_nrmse(kv_type t, const float *x, int64_t n, uint8_t *q, float *y) {
    const kv_qext_ops *o = kv_qext_get(t);
    o->quantize_row(x, q, n);
    o->dequantize_row(q, y, n);
    double se = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        se += (double)(x[i] - y[i]) * (x[i] - y[i]);
        ss += (double)x[i] * x[i];
    }
    return sqrt(se / ss);
}

static void test_roundtrip_error(void) {
    const int64_t n = 256 * 64;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *q = malloc(row_bytes(KV_TYPE_Q8_K, n));
    REQUIRE(x && y && q);
    /* typical figures on this data: q8_1 0.5%, q8_K 0.8% (256-wide blocks hold
     * most outliers), q6_K 1.8%, q5_* 3.5-4.3%, q4_K 7% */
    static const struct {
        kv_type t;
        double bound;
    } lim[] = {{KV_TYPE_Q8_1, 0.01},  {KV_TYPE_Q8_K, 0.015},  {KV_TYPE_Q6_K, 0.025}, {KV_TYPE_Q5_K, 0.045},
               {KV_TYPE_Q5_0, 0.055}, {KV_TYPE_Q5_1, 0.05},  {KV_TYPE_Q4_K, 0.085}};
    for (int i = 0; i < n; i++) x[i] = gauss() * 0.02f;
    for (size_t k = 0; k < sizeof lim / sizeof lim[0]; k++) {
        double e = roundtrip_nrmse(lim[k].t, x, n, q, y);
        printf("  %-5s nrmse %.4f (bound %.3f)\n", kv_type_name(lim[k].t), e, lim[k].bound);
        CHECKF(e < lim[k].bound, "%s nrmse %.4f", kv_type_name(lim[k].t), e);
        for (int64_t i = 0; i < n; i++) CHECKF(isfinite(y[i]), "%s", kv_type_name(lim[k].t));
    }
    /* more bits, less error: the types order as their bit widths say */
    double e4 = roundtrip_nrmse(KV_TYPE_Q4_K, x, n, q, y), e5 = roundtrip_nrmse(KV_TYPE_Q5_K, x, n, q, y);
    double e6 = roundtrip_nrmse(KV_TYPE_Q6_K, x, n, q, y);
    CHECK(e6 < e5 && e5 < e4);
    /* a min/max 4-bit fit per 32 with exact float scale and min (q4_1 with no
     * rounding of d and m) is what q4_K must beat with its scale search
     * despite 6-bit scales */
    double se = 0, ss = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        float mn = xb[0], mx = xb[0];
        for (int i = 1; i < 32; i++) {
            mn = fminf(mn, xb[i]);
            mx = fmaxf(mx, xb[i]);
        }
        float d = (mx - mn) / 15;
        for (int i = 0; i < 32; i++) {
            float v = d ? mn + d * roundf((xb[i] - mn) / d) : mn;
            se += (double)(xb[i] - v) * (xb[i] - v);
            ss += (double)xb[i] * xb[i];
        }
    }
    double naive = sqrt(se / ss);
    printf("  naive 4-bit min/max fit %.4f vs q4_k %.4f\n", naive, e4);
    CHECK(e4 < naive);
    FREE_ALL(x, y, q);
}

/* Special inputs: zeros, constants, exact grids and non-finite values. */
static void test_special_inputs(void) {
    const int64_t n = 512;
    float x[512], y[512];
    uint8_t q[292 * 2];
    for (int k = 0; k < N_TYPES; k++) {
        const kv_qext_ops *o = kv_qext_get(new_types[k]);
        memset(x, 0, sizeof x);
        o->quantize_row(x, q, n);
        o->dequantize_row(q, y, n);
        for (int i = 0; i < n; i++) CHECKF(y[i] == 0.f, "%s zeros", kv_type_name(o->type));
        for (int i = 0; i < n; i++) x[i] = 0.75f;
        o->quantize_row(x, q, n);
        o->dequantize_row(q, y, n);
        for (int i = 0; i < n; i++) CHECKF(fabsf(y[i] - 0.75f) < 0.75f * 0.02f, "%s const %g", kv_type_name(o->type), y[i]);
        /* one NaN or inf must not crash nor spoil other blocks (the last block stays exact-ish) */
        for (int i = 0; i < n; i++) x[i] = (float)(i % 7) * 0.1f - 0.3f;
        x[3] = NAN;
        x[5] = INFINITY;
        o->quantize_row(x, q, n);
        o->dequantize_row(q, y, n);
        for (int i = 256; i < n; i++) CHECKF(fabsf(y[i] - x[i]) < 0.02f, "%s after NaN: %d %g %g", kv_type_name(o->type), i, y[i], x[i]);
    }
    /* grids a type represents exactly survive the round trip unchanged */
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.5f; /* q5_0: d = -8 / -16 = 0.5 */
    kv_qext_get(KV_TYPE_Q5_0)->quantize_row(x, q, 32);
    kv_qext_get(KV_TYPE_Q5_0)->dequantize_row(q, y, 32);
    for (int i = 0; i < 32; i++) CHECK(y[i] == x[i]);
    for (int i = 0; i < 32; i++) x[i] = 1.0f + (float)((i * 7) % 32) * 0.25f; /* q5_1: m = 1, d = 0.25 */
    kv_qext_get(KV_TYPE_Q5_1)->quantize_row(x, q, 32);
    kv_qext_get(KV_TYPE_Q5_1)->dequantize_row(q, y, 32);
    for (int i = 0; i < 32; i++) CHECK(y[i] == x[i]);
}

static void test_act_quant(void) {
    const int64_t n = 512;
    float x[512];
    for (int i = 0; i < n; i++) x[i] = gauss();
    kv_block_q8_K k8[2];
    REQUIRE(kv_qext_quantize_act(KV_TYPE_Q8_K, x, k8, n) == 0);
    for (int b = 0; b < 2; b++) {
        float amax = 0;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[256 * b + i]));
        CHECK(fabsf(fabsf(k8[b].d) * 127.f - amax) <= amax * 1e-6f);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += k8[b].qs[16 * g + l];
            CHECK(k8[b].bsums[g] == s);
        }
        for (int i = 0; i < 256; i++) CHECK(fabsf(k8[b].d * k8[b].qs[i] - x[256 * b + i]) <= fabsf(k8[b].d) * 0.5001f);
    }
    kv_block_q8_1 q81[16];
    REQUIRE(kv_qext_quantize_act(KV_TYPE_Q8_1, x, q81, n) == 0);
    for (int b = 0; b < 16; b++) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += q81[b].qs[i];
        float d = kv_fp16_to_fp32(q81[b].d), sd = kv_fp16_to_fp32(q81[b].s);
        CHECK(fabsf(sd - d * s) <= fabsf(d * s) * 1e-3f + 1e-6f);
    }
    uint8_t q80[34 * 16];
    CHECK(kv_qext_quantize_act(KV_TYPE_Q8_0, x, q80, n) == 0);
    /* bad input is refused */
    CHECK(kv_qext_quantize_act(KV_TYPE_Q8_K, x, k8, 100) == -1);
    CHECK(kv_qext_quantize_act(KV_TYPE_Q8_0, x, q80, 33) == -1);
    CHECK(kv_qext_quantize_act(KV_TYPE_Q4_K, x, k8, 256) == -1);
    CHECK(kv_qext_quantize_act(KV_TYPE_Q8_K, x, k8, -256) == -1);
}

/* Every level's activation quantizer equals the scalar one byte for byte
 * (q8_K: the scale, the quants and the group sums), on fresh random rows
 * and on the cases a SIMD port gets wrong: the largest magnitude reached
 * twice with opposite signs (the first wins), rounding ties (iscale = -1
 * puts x.5 on a tie), zeros, a lone NaN (its payload), infinities,
 * subnormals and a row of one constant. */
static void test_act_quant_isa(void) {
    enum { NB = 8, N = NB * 256 };
    float *x = malloc(N * sizeof *x);
    uint8_t *ref = malloc(NB * sizeof(kv_block_q8_K)), *got = malloc(NB * sizeof(kv_block_q8_K));
    REQUIRE(x && ref && got);
    const kv_qext_from_f32_fn scalar = kv_qext_quant_act_isa(KV_TYPE_Q8_K, KV_QEXT_ISA_SCALAR);
    REQUIRE(scalar != NULL);
    CHECK(kv_qext_quant_act_isa(KV_TYPE_Q4_K, KV_QEXT_ISA_SCALAR) == NULL);
    int levels = 0;
    for (int isa = 1; isa <= 2; isa++) {
        const kv_qext_from_f32_fn f = kv_qext_quant_act_isa(KV_TYPE_Q8_K, (kv_qext_isa)isa);
        if (!f) continue;
        levels++;
        for (int rep = 0; rep < 200; rep++) {
            const float sc = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.f : 300.f;
            for (int i = 0; i < N; i++) x[i] = gauss() * sc;
            /* block 0: the top magnitude twice, negative first; block 1:
             * ties to even; block 2 zeros with one NaN; block 3 +inf and
             * -inf; block 4 subnormals; block 5 a constant; block 6 a NaN
             * with a payload among normal values */
            const int a = (int)(rnd() % 128), b = 128 + (int)(rnd() % 128);
            x[a] = -50.f * sc;
            x[b] = 50.f * sc;
            for (int i = 0; i < 256; i++) x[256 + i] = (float)((int)(rnd() % 255) - 127) * 0.5f;
            x[256 + (int)(rnd() % 256)] = 127.f;
            for (int i = 0; i < 256; i++) x[512 + i] = 0.f;
            x[512 + (int)(rnd() % 256)] = NAN;
            x[768 + (int)(rnd() % 256)] = (rep & 1) ? INFINITY : -INFINITY;
            if (rep & 2) x[768 + (int)(rnd() % 256)] = -INFINITY;
            for (int i = 0; i < 256; i++) x[1024 + i] = (float)((int)(rnd() % 2001) - 1000) * 1e-42f;
            for (int i = 0; i < 256; i++) x[1280 + i] = -0.375f;
            uint32_t nan_bits = 0x7f800001u | (uint32_t)(rnd() & 0x7fffff) | (uint32_t)(rnd() & 1) << 31;
            memcpy(&x[1536 + (int)(rnd() % 256)], &nan_bits, 4);
            scalar(x, ref, N);
            memset(got, 0xA5, NB * sizeof(kv_block_q8_K));
            f(x, got, N);
            for (int blk = 0; blk < NB; blk++)
                CHECKF(memcmp(ref + blk * sizeof(kv_block_q8_K), got + blk * sizeof(kv_block_q8_K),
                              sizeof(kv_block_q8_K)) == 0,
                       "%s q8_K activations differ from the scalar ones in block %d (rep %d)",
                       kv_qext_isa_name((kv_qext_isa)isa), blk, rep);
        }
    }
    printf("  q8_K activation quantizer: %d SIMD level(s) checked against the scalar one\n", levels);
    FREE_ALL(x, ref, got);
}

/* One weight row and one activation row for type t, n elements:
 * half the time quantized from random floats, half random block bytes. */
static void make_pair(kv_type t, int64_t n, uint8_t *w, uint8_t *a, float *tmp, int random_bytes) {
    const kv_qext_ops *o = kv_qext_get(t);
    if (random_bytes) {
        random_blocks(t, w, n);
    } else {
        for (int64_t i = 0; i < n; i++) tmp[i] = gauss();
        o->quantize_row(tmp, w, n);
    }
    for (int64_t i = 0; i < n; i++) tmp[i] = gauss() * 3.f;
    o->quantize_act_row(tmp, a, n);
}

static void test_dot_matches_dequant_and_simd(void) {
    static const int64_t lens[] = {256, 512, 1280, 4096};
    const int64_t nmax = 4096;
    uint8_t *w = malloc(row_bytes(KV_TYPE_Q8_K, nmax)), *a = malloc(row_bytes(KV_TYPE_Q8_K, nmax));
    float *tmp = malloc(nmax * sizeof(float)), *wf = malloc(nmax * sizeof(float)), *af = malloc(nmax * sizeof(float));
    REQUIRE(w && a && tmp && wf && af);
    int paths = 0;
    for (int k = 0; k < N_TYPES; k++) {
        kv_type t = new_types[k];
        const kv_qext_ops *o = kv_qext_get(t);
        const kv_qext_ops *va = kv_qext_get(o->vec_type);
        for (int li = 0; li < 4 + 2; li++) {
            /* 32-element types also get odd block counts (the AVX-512 tail) */
            int64_t n = li < 4 ? lens[li] : (o->blck_size == 32 ? 32 * (li == 4 ? 1 : 37) : 256 * (li == 4 ? 1 : 3));
            for (int rep = 0; rep < 6; rep++) {
                make_pair(t, n, w, a, tmp, rep & 1);
                o->dequantize_row(w, wf, n);
                /* activations dequantized through their own type's ops; q8_0 has none here */
                if (va) {
                    va->dequantize_row(a, af, n);
                } else {
                    for (int64_t b = 0; b < n / 32; b++) {
                        float d = kv_fp16_to_fp32((uint16_t)(a[34 * b] | a[34 * b + 1] << 8));
                        for (int i = 0; i < 32; i++) af[32 * b + i] = d * (float)(int8_t)a[34 * b + 2 + i];
                    }
                }
                double want = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    want += (double)wf[i] * af[i];
                    mag += fabs((double)wf[i] * af[i]);
                }
                /* q5_1's min term goes through the fp16 s = d * sum(q) of the activation block */
                const double tol_ref = (t == KV_TYPE_Q5_1 ? 2e-3 : 1e-5) * mag + 1e-9;
                float ref = o->vec_dot_ref(n, w, a);
                CHECKF(fabs(ref - want) <= tol_ref, "%s n=%lld: ref %.7g dequantized %.7g (mag %.3g)",
                       kv_type_name(t), (long long)n, ref, want, mag);
                for (int isa = 1; isa <= 2; isa++) {
                    kv_qext_dot_fn f = kv_qext_vec_dot_isa(t, (kv_qext_isa)isa);
                    if (!f) continue;
                    paths++;
                    float got = f(n, w, a);
                    CHECKF(fabs(got - ref) <= 1e-5 * mag + 1e-9, "%s %s n=%lld: %.7g vs ref %.7g (mag %.3g)",
                           kv_type_name(t), kv_qext_isa_name((kv_qext_isa)isa), (long long)n, got, ref, mag);
                    CHECK(f(n, w, a) == got); /* deterministic */
                }
            }
        }
    }
    printf("  %d SIMD dot comparisons (%s%s)\n", paths, kv_qext_isa_available(KV_QEXT_ISA_AVX2) ? "avx2 " : "",
           kv_qext_isa_available(KV_QEXT_ISA_AVX512) ? "avx512" : "");
    FREE_ALL(w, a, tmp, wf, af);
}

/* The tiled dots (kv_qext_rows_isa) of every type and level that has them:
 * each output bit-identical to that level's vec_dot whatever the number of
 * weight rows (full 4-row tiles and every leftover) and activation rows
 * (the streaming tiles up to 2, the batched ones past that, across their
 * 16-row blocks and unpacking chunks), rows at a padded
 * stride, outputs at a stride with the gaps left alone; and within a
 * normalised error of the scalar reference. Fresh random weights
 * (quantized or raw block bytes). */
typedef struct rows_case {
    int64_t K;
    int nr_max, na_max;
} rows_case;

/* One case of test_rows_tiles for type t at one level: outputs checked. */
static int rows_case_check(kv_type t, kv_qext_isa isa, const rows_case *c, const uint8_t *w, size_t ws,
                           const uint8_t *a, size_t as, float *y, size_t ys) {
    const kv_qext_ops *o = kv_qext_get(t);
    kv_qext_rows_fn rows = kv_qext_rows_isa(t, isa);
    kv_qext_dot_fn dot = kv_qext_vec_dot_isa(t, isa);
    int checked = 0;
    if (!rows) return 0;
    CHECK(dot != NULL);
    for (int nr = 1; nr <= c->nr_max; nr++) {
        for (int na = 1; na <= c->na_max; na++) {
            if (na > 5 && na < c->na_max - 2 && na != 16) continue; /* the block edges are what matter */
            for (size_t i = 0; i < ys * (size_t)c->na_max; i++) y[i] = -12345.f;
            rows(c->K, w, ws, nr, a, as, na, y, ys);
            for (int j = 0; j < c->na_max; j++) {
                for (int r = 0; r < (int)ys; r++) {
                    float got = y[j * ys + r];
                    if (j >= na || r >= nr) {
                        CHECKF(got == -12345.f, "%s rows wrote outside %dx%d at (%d, %d)", kv_type_name(t), nr, na, r, j);
                        continue;
                    }
                    float want = dot(c->K, w + r * ws, a + j * as);
                    float ref = o->vec_dot_ref(c->K, w + r * ws, a + j * as);
                    CHECKF(memcmp(&got, &want, sizeof got) == 0, "%s %s K=%lld rows %dx%d (%d, %d): %.9g, dot %.9g",
                           kv_type_name(t), kv_qext_isa_name(isa), (long long)c->K, nr, na, r, j, got, want);
                    CHECKF(fabsf(got - ref) <= 1e-5f * (fabsf(ref) + 1.f) * 64.f, "%s rows (%d, %d): %.7g vs ref %.7g",
                           kv_type_name(t), r, j, got, ref);
                    checked++;
                }
            }
        }
    }
    return checked;
}

static void test_rows_tiles(void) {
    /* 32-element types: an odd block count, and past two 16-pair chunks */
    static const rows_case cases[2][2] = {{{768, 9, 5}, {2304, 5, 18}}, {{672, 9, 5}, {2336, 5, 18}}};
    int checked = 0;
    for (int k = 0; k < N_TYPES; k++) {
        kv_type t = new_types[k];
        const kv_qext_ops *o = kv_qext_get(t);
        for (int ci = 0; ci < 2; ci++) {
            const rows_case *c = &cases[o->blck_size == 32][ci];
            const size_t ws = row_bytes(t, c->K) + 8, as = row_bytes(o->vec_type, c->K) + 4, ys = 16;
            uint8_t *w = malloc(ws * c->nr_max), *a = malloc(as * c->na_max);
            float *tmp = malloc(c->K * sizeof(float)), *y = malloc(ys * c->na_max * sizeof(float));
            REQUIRE(w && a && tmp && y);
            uint8_t *ascratch = malloc(ws > as ? ws : as); /* a weight or an activation row */
            REQUIRE(ascratch);
            for (int r = 0; r < c->nr_max; r++) make_pair(t, c->K, w + r * ws, ascratch, tmp, r & 1);
            for (int j = 0; j < c->na_max; j++) make_pair(t, c->K, ascratch, a + j * as, tmp, 0);
            for (int isa = 0; isa <= 2; isa++) checked += rows_case_check(t, (kv_qext_isa)isa, c, w, ws, a, as, y, ys);
            FREE_ALL(w, a, tmp, y, ascratch);
        }
    }
    printf("  %d tiled outputs checked\n", checked);
    if (kv_qext_isa_available(KV_QEXT_ISA_AVX512)) CHECK(checked > 0);
}

static void test_determinism(void) {
    const int64_t n = 2048;
    float *x = malloc(n * sizeof *x);
    uint8_t *q1 = malloc(row_bytes(KV_TYPE_Q8_K, n)), *q2 = malloc(row_bytes(KV_TYPE_Q8_K, n));
    REQUIRE(x && q1 && q2);
    for (int i = 0; i < n; i++) x[i] = gauss();
    for (int k = 0; k < N_TYPES; k++) {
        const kv_qext_ops *o = kv_qext_get(new_types[k]);
        size_t rb = row_bytes(o->type, n);
        memset(q1, 0xAA, rb);
        memset(q2, 0x55, rb);
        o->quantize_row(x, q1, n);
        o->quantize_row(x, q2, n);
        CHECKF(memcmp(q1, q2, rb) == 0, "%s", kv_type_name(o->type));
        /* blocks are independent: two halves quantized apart give the same bytes */
        o->quantize_row(x, q2, n / 2);
        o->quantize_row(x + n / 2, q2 + rb / 2, n / 2);
        CHECKF(memcmp(q1, q2, rb) == 0, "%s halves", kv_type_name(o->type));
    }
    FREE_ALL(x, q1, q2);
}

/* Speed of each dot path over a 4096 x 4096 weight matrix, one thread:
 * GB/s of weight bytes streamed. Only with KVTOP_QEXT_BENCH=1. */
static void test_bench(void) {
    const char *b = getenv("KVTOP_QEXT_BENCH");
    if (!b || strcmp(b, "1") != 0) {
        printf("  (skipped: set KVTOP_QEXT_BENCH=1)\n");
        return;
    }
    const int64_t K = 4096, M = 4096;
    { /* the q8_K activation quantizer per level: 64 rows of 2048 (a batch of ffn_down inputs) */
        const int64_t n = 64 * 2048;
        float *x = malloc(n * sizeof *x);
        uint8_t *q = malloc((size_t)(n / 256) * sizeof(kv_block_q8_K));
        REQUIRE(x && q);
        for (int64_t i = 0; i < n; i++) x[i] = gauss();
        printf("  q8_K activations");
        for (int isa = 0; isa <= 2; isa++) {
            const kv_qext_from_f32_fn f = kv_qext_quant_act_isa(KV_TYPE_Q8_K, (kv_qext_isa)isa);
            if (!f) continue;
            double best = 1e30;
            for (int rep = 0; rep < 7; rep++) {
                const uint64_t t0 = kv_now_ns();
                f(x, q, n);
                const double s = (double)(kv_now_ns() - t0) * 1e-9;
                if (s < best) best = s;
            }
            printf("  %s %.3f ns/element", kv_qext_isa_name((kv_qext_isa)isa), best / (double)n * 1e9);
        }
        printf("\n");
        FREE_ALL(x, q);
    }
    for (int k = 0; k < N_TYPES; k++) {
        kv_type t = new_types[k];
        const kv_qext_ops *o = kv_qext_get(t);
        size_t rb = row_bytes(t, K);
        uint8_t *w = malloc(rb * M), *a = malloc(row_bytes(KV_TYPE_Q8_K, K));
        float *tmp = malloc(K * sizeof(float));
        REQUIRE(w && a && tmp);
        for (int64_t r = 0; r < M; r++) random_blocks(t, w + r * rb, K);
        for (int64_t i = 0; i < K; i++) tmp[i] = gauss();
        o->quantize_act_row(tmp, a, K);
        printf("  %-5s", kv_type_name(t));
        double gbs[3] = {0, 0, 0};
        for (int isa = 0; isa <= 2; isa++) {
            kv_qext_dot_fn f = kv_qext_vec_dot_isa(t, (kv_qext_isa)isa);
            if (!f) continue;
            volatile float sink = 0;
            double best = 1e30;
            for (int rep = 0; rep < (isa ? 5 : 2); rep++) {
                uint64_t t0 = kv_now_ns();
                for (int64_t r = 0; r < M; r++) sink += f(K, w + r * rb, a);
                double s = (double)(kv_now_ns() - t0) * 1e-9;
                if (s < best) best = s;
            }
            CHECK(isfinite(sink));
            gbs[isa] = (double)rb * M / best / 1e9;
            printf("  %s %6.2f GB/s", kv_qext_isa_name((kv_qext_isa)isa), gbs[isa]);
        }
        printf("\n");
        if (gbs[1] > 0) CHECKF(gbs[1] > gbs[0], "%s avx2 not faster than scalar", kv_type_name(t));
        FREE_ALL(w, a, tmp);
    }
}

TEST_MAIN(T(test_table), T(test_init_marks_supported), T(test_dequant_matches_layout), T(test_roundtrip_error),
          T(test_special_inputs), T(test_act_quant), T(test_act_quant_isa), T(test_dot_matches_dequant_and_simd), T(test_rows_tiles),
          T(test_determinism),
          T(test_bench))
