/* quant.c - row conversions between f32 and the supported GGUF encodings
 * (f32, f16, bf16, q8_0, q4_0, q4_1), bit-compatible with GGUF blocks and
 * rounding the way GGUF's reference quantizers do; the other block types
 * (q5_x, q8_1, K-quants) are passed on to quant_ext. Pure functions: no
 * state, no allocation, safe from any thread. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_ext.h"
#include "types.h"

#define QK 32 /* elements per block of the 32-wide formats */

/* trunc(v) clamped to [0, 15]; NaN gives 0. For finite blocks v lies in
 * [0.5, 16.5] and this equals GGUF's MIN(15, (int8_t)v) - the clamp only
 * keeps inf/NaN inputs from reaching an undefined float->int cast. */
static inline unsigned nib(float v) {
    if (!(v > 0.0f)) return 0;
    return v >= 15.0f ? 15u : (unsigned)v;
}

/* Block layouts, exactly as stored in a GGUF file (little endian, packed:
 * every field is 1 or 2 bytes wide, so there is no padding). */
typedef struct {
    uint16_t d;      /* fp16 scale */
    int8_t qs[QK];   /* value = qs[i] * d */
} blk_q8_0;
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint8_t qs[QK / 2];  /* element i < 16: low nibble of qs[i]; i >= 16: high nibble of qs[i-16]; value = (q - 8) * d */
} blk_q4_0;
typedef struct {
    uint16_t d;          /* fp16 scale */
    uint16_t m;          /* fp16 minimum */
    uint8_t qs[QK / 2];  /* nibbles as in q4_0; value = q * d + m */
} blk_q4_1;

_Static_assert(sizeof(blk_q8_0) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q4_0) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1 block is 20 bytes");

/* Blocks may sit at any byte offset (34-byte records), so fields are read
 * with memcpy; the structs are only used for their offsets. */
static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- decode (n elements, n % block == 0) ---- */

static void deq_f32(const void *src, float *dst, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }

static void deq_f16(const void *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = kv_fp16_to_fp32(rd16((const uint8_t *)src + 2 * i));
}

static void deq_bf16(const void *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = kv_bf16_to_fp32(rd16((const uint8_t *)src + 2 * i));
}

static void deq_q8_0(const void *vsrc, float *dst, int64_t n) {
    const uint8_t *src = vsrc;
    for (int64_t b = 0; b < n / QK; b++, src += sizeof(blk_q8_0), dst += QK) {
        float d = kv_fp16_to_fp32(rd16(src));
        const int8_t *qs = (const int8_t *)(src + 2);
        for (int i = 0; i < QK; i++) dst[i] = (float)qs[i] * d;
    }
}

static void deq_q4_0(const void *vsrc, float *dst, int64_t n) {
    const uint8_t *src = vsrc;
    for (int64_t b = 0; b < n / QK; b++, src += sizeof(blk_q4_0), dst += QK) {
        float d = kv_fp16_to_fp32(rd16(src));
        const uint8_t *qs = src + 2;
        for (int i = 0; i < QK / 2; i++) {
            dst[i] = (float)((qs[i] & 0x0F) - 8) * d;
            dst[i + QK / 2] = (float)((qs[i] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const void *vsrc, float *dst, int64_t n) {
    const uint8_t *src = vsrc;
    for (int64_t b = 0; b < n / QK; b++, src += sizeof(blk_q4_1), dst += QK) {
        float d = kv_fp16_to_fp32(rd16(src));
        float m = kv_fp16_to_fp32(rd16(src + 2));
        const uint8_t *qs = src + 4;
        for (int i = 0; i < QK / 2; i++) {
            dst[i] = (float)(qs[i] & 0x0F) * d + m;
            dst[i + QK / 2] = (float)(qs[i] >> 4) * d + m;
        }
    }
}

/* ---- encode ---- */

static void q_f32(const float *src, void *dst, int64_t n) { memmove(dst, src, (size_t)n * sizeof(float)); }

static void q_f16(const float *src, void *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) wr16((uint8_t *)dst + 2 * i, kv_fp32_to_fp16(src[i]));
}

static void q_bf16(const float *src, void *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) wr16((uint8_t *)dst + 2 * i, kv_fp32_to_bf16(src[i]));
}

/* q8_0: d = amax / 127, q = round(x / d) (half away from zero, as roundf). */
static void q_q8_0(const float *x, void *vdst, int64_t n) {
    uint8_t *dst = vdst;
    for (int64_t b = 0; b < n / QK; b++, x += QK, dst += sizeof(blk_q8_0)) {
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(dst, kv_fp32_to_fp16(d));
        int8_t *qs = (int8_t *)(dst + 2);
        for (int i = 0; i < QK; i++) {
            float v = roundf(x[i] * id); /* in [-127, 127] for finite blocks */
            qs[i] = (int8_t)(v >= -127.0f && v <= 127.0f ? v : 0.0f);
        }
    }
}

/* q4_0: d = (the value of largest magnitude, with its sign) / -8, so that
 * value maps to q = 0 and the range [-8, 7] is used in full;
 * q = min(15, trunc(x / d + 8.5)). */
static void q_q4_0(const float *x, void *vdst, int64_t n) {
    uint8_t *dst = vdst;
    for (int64_t b = 0; b < n / QK; b++, x += QK, dst += sizeof(blk_q4_0)) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < QK; i++) {
            if (amax < fabsf(x[i])) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(dst, kv_fp32_to_fp16(d));
        uint8_t *qs = dst + 2;
        for (int i = 0; i < QK / 2; i++) {
            qs[i] = (uint8_t)(nib(x[i] * id + 8.5f) | nib(x[i + QK / 2] * id + 8.5f) << 4);
        }
    }
}

/* q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)). */
static void q_q4_1(const float *x, void *vdst, int64_t n) {
    uint8_t *dst = vdst;
    for (int64_t b = 0; b < n / QK; b++, x += QK, dst += sizeof(blk_q4_1)) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int i = 0; i < QK; i++) {
            if (x[i] < min) min = x[i];
            if (x[i] > max) max = x[i];
        }
        float d = (max - min) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(dst, kv_fp32_to_fp16(d));
        wr16(dst + 2, kv_fp32_to_fp16(min));
        uint8_t *qs = dst + 4;
        for (int i = 0; i < QK / 2; i++) {
            qs[i] = (uint8_t)(nib((x[i] - min) * id + 0.5f) | nib((x[i + QK / 2] - min) * id + 0.5f) << 4);
        }
    }
}

/* ---- the row functions of each type ---- */

typedef struct row_ops {
    int64_t blck;                 /* elements per block */
    kv_qext_to_f32_fn to_f32;     /* decode n elements */
    kv_qext_from_f32_fn from_f32; /* encode n elements */
} row_ops;

static const row_ops basic_ops[KV_TYPE_COUNT] = {
    [KV_TYPE_F32] = {1, deq_f32, q_f32},      [KV_TYPE_F16] = {1, deq_f16, q_f16},
    [KV_TYPE_BF16] = {1, deq_bf16, q_bf16},   [KV_TYPE_Q8_0] = {QK, deq_q8_0, q_q8_0},
    [KV_TYPE_Q4_0] = {QK, deq_q4_0, q_q4_0}, [KV_TYPE_Q4_1] = {QK, deq_q4_1, q_q4_1},
};

/* t's row functions into *o: the basic types' above, the other GGUF block
 * types' from quant_ext. Returns 0 when t has none. NOTE: not
 * kv_type_get(): workers call these functions concurrently (get_rows) and
 * the traits getter writes a shared temporary for types quant_ext marks. */
static int row_ops_of(kv_type t, row_ops *o) {
    if ((unsigned)t < KV_TYPE_COUNT && basic_ops[t].to_f32) {
        *o = basic_ops[t];
        return 1;
    }
    const kv_qext_ops *q = kv_qext_get(t);
    if (!q) return 0;
    *o = (row_ops){q->blck_size, q->dequantize_row, q->quantize_row};
    return 1;
}

int kv_dequantize_row(kv_type t, const void *src, float *dst, int64_t n) {
    row_ops o;
    if (!row_ops_of(t, &o) || n < 0 || n % o.blck || !src || !dst) return -1;
    o.to_f32(src, dst, n);
    return 0;
}

int kv_quantize_row(kv_type t, const float *src, void *dst, int64_t n) {
    row_ops o;
    if (!row_ops_of(t, &o) || n < 0 || n % o.blck || !src || !dst) return -1;
    o.from_f32(src, dst, n);
    return 0;
}
