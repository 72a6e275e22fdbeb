/* kv_dtype.c - KV cache element formats: names, row sizes, and the
 * reference (scalar) row encoders and decoders for f32, f16, int8
 * (symmetric and asymmetric) and OCP fp8 (e4m3, e5m2). Layouts are
 * described in kv_dtype.h; the CPU attention kernel decodes through these. */
#include "kv_dtype.h"

#include <math.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "fp_bits.h"
#include "types.h"

static const char *const dtype_names[KV_CACHE_DTYPE_COUNT] = {
    [KV_CACHE_F32] = "f32",           [KV_CACHE_F16] = "f16",
    [KV_CACHE_INT8] = "int8",         [KV_CACHE_INT8_ASYM] = "int8_asym",
    [KV_CACHE_FP8_E4M3] = "fp8_e4m3", [KV_CACHE_FP8_E5M2] = "fp8_e5m2",
};

const char *kv_cache_dtype_name(kv_cache_dtype d) {
    if ((int)d < 0 || d >= KV_CACHE_DTYPE_COUNT) return "unknown";
    return dtype_names[d];
}

int kv_cache_dtype_from_name(const char *s, kv_cache_dtype *out) {
    if (!s) return -1;
    for (int i = 0; i < KV_CACHE_DTYPE_COUNT; i++) {
        if (strcasecmp(s, dtype_names[i]) == 0) {
            if (out) *out = (kv_cache_dtype)i;
            return 0;
        }
    }
    /* "fp8" alone means e4m3, the format inference engines default to. */
    if (strcasecmp(s, "fp8") == 0) {
        if (out) *out = KV_CACHE_FP8_E4M3;
        return 0;
    }
    return -1;
}

size_t kv_cache_row_bytes(kv_cache_dtype d, int head_dim) {
    if (head_dim <= 0) return 0;
    size_t n = (size_t)head_dim;
    switch (d) {
    case KV_CACHE_F32: return n * 4;
    case KV_CACHE_F16: return n * 2;
    case KV_CACHE_INT8: return n + 4;
    case KV_CACHE_INT8_ASYM: return n + 8;
    case KV_CACHE_FP8_E4M3:
    case KV_CACHE_FP8_E5M2: return n + 4;
    default: return 0;
    }
}

int kv_dtype_is_quantized(kv_cache_dtype d) {
    return d == KV_CACHE_INT8 || d == KV_CACHE_INT8_ASYM || d == KV_CACHE_FP8_E4M3 || d == KV_CACHE_FP8_E5M2;
}

/* ---- fp8 (the conversions: fp_bits.h; decoding through a table) ---- */

static float lut_e4m3[256], lut_e5m2[256];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_init(void) {
    for (int i = 0; i < 256; i++) {
        lut_e4m3[i] = kv_fp8_bits_to_f32((uint32_t)i, 3, 7, 0);
        lut_e5m2[i] = kv_fp8_bits_to_f32((uint32_t)i, 2, 15, 1);
    }
}

uint8_t kv_fp8_e4m3_from_fp32(float f) { return kv_f32_to_fp8_bits(f, 3, 7, 0x7e, 0x7f); }
uint8_t kv_fp8_e5m2_from_fp32(float f) { return kv_f32_to_fp8_bits(f, 2, 15, 0x7b, 0x7e); }

float kv_fp8_e4m3_to_fp32(uint8_t v) {
    pthread_once(&lut_once, lut_init);
    return lut_e4m3[v];
}

float kv_fp8_e5m2_to_fp32(uint8_t v) {
    pthread_once(&lut_once, lut_init);
    return lut_e5m2[v];
}

/* ---- rows ---- */

/* NaNs (quiet or signalling) are skipped: fmaxf would let a signalling
 * NaN through on some libcs, and the SIMD encoders skip them too. */
static float row_absmax(const float *x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > a) a = v;
    }
    return a;
}

void kv_dtype_encode_row(kv_cache_dtype d, const float *src, void *dst, int head_dim) {
    uint8_t *o = dst;
    const int n = head_dim;
    switch (d) {
    case KV_CACHE_F32:
        memcpy(o, src, (size_t)n * 4);
        break;
    case KV_CACHE_F16:
        for (int i = 0; i < n; i++) {
            uint16_t h = kv_fp32_to_fp16(src[i]);
            memcpy(o + 2 * (size_t)i, &h, 2);
        }
        break;
    case KV_CACHE_INT8: {
        float scale = row_absmax(src, n) / 127.0f;
        float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < n; i++) {
            float q = rintf(src[i] * inv);
            q = fminf(fmaxf(q, -127.0f), 127.0f);
            o[i] = (uint8_t)(int8_t)q;
        }
        memcpy(o + n, &scale, 4);
        break;
    }
    case KV_CACHE_INT8_ASYM: {
        float mn = n ? src[0] : 0.0f, mx = mn;
        for (int i = 1; i < n; i++) {
            mn = fminf(mn, src[i]);
            mx = fmaxf(mx, src[i]);
        }
        float scale = (mx - mn) / 255.0f;
        float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < n; i++) {
            float q = rintf((src[i] - mn) * inv);
            o[i] = (uint8_t)fminf(fmaxf(q, 0.0f), 255.0f);
        }
        memcpy(o + n, &scale, 4);
        memcpy(o + n + 4, &mn, 4);
        break;
    }
    case KV_CACHE_FP8_E4M3:
    case KV_CACHE_FP8_E5M2: {
        int e4 = d == KV_CACHE_FP8_E4M3;
        float scale = row_absmax(src, n) / (e4 ? KV_FP8_E4M3_MAX : KV_FP8_E5M2_MAX);
        float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < n; i++)
            o[i] = e4 ? kv_fp8_e4m3_from_fp32(src[i] * inv) : kv_fp8_e5m2_from_fp32(src[i] * inv);
        memcpy(o + n, &scale, 4);
        break;
    }
    default:
        break;
    }
}

void kv_dtype_decode_row(kv_cache_dtype d, const void *src, float *dst, int head_dim) {
    const uint8_t *p = src;
    const int n = head_dim;
    float scale, mn;
    switch (d) {
    case KV_CACHE_F32:
        memcpy(dst, p, (size_t)n * 4);
        break;
    case KV_CACHE_F16:
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * (size_t)i, 2);
            dst[i] = kv_fp16_to_fp32(h);
        }
        break;
    case KV_CACHE_INT8:
        memcpy(&scale, p + n, 4);
        for (int i = 0; i < n; i++) dst[i] = (float)(int8_t)p[i] * scale;
        break;
    case KV_CACHE_INT8_ASYM:
        memcpy(&scale, p + n, 4);
        memcpy(&mn, p + n + 4, 4);
        for (int i = 0; i < n; i++) dst[i] = mn + (float)p[i] * scale;
        break;
    case KV_CACHE_FP8_E4M3:
    case KV_CACHE_FP8_E5M2: {
        pthread_once(&lut_once, lut_init);
        const float *lut = d == KV_CACHE_FP8_E4M3 ? lut_e4m3 : lut_e5m2;
        memcpy(&scale, p + n, 4);
        for (int i = 0; i < n; i++) dst[i] = lut[p[i]] * scale;
        break;
    }
    default:
        for (int i = 0; i < n; i++) dst[i] = 0.0f;
        break;
    }
}
