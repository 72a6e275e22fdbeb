/* types.c - type traits table and half-precision conversions. The row
 * conversions (quantize / dequantize) live in quant.c. */
#include "types.h"

#include <ctype.h>
#include <string.h>

#include "fp_bits.h"

/* blck_size / type_size follow GGUF's block structs exactly. The `supported`
 * column is what kvtop can dequantize and multiply. */
static const kv_type_traits traits[KV_TYPE_COUNT] = {
    [KV_TYPE_F32] = {"f32", 1, 4, 1},
    [KV_TYPE_F16] = {"f16", 1, 2, 1},
    [KV_TYPE_Q4_0] = {"q4_0", 32, 2 + 16, 1},
    [KV_TYPE_Q4_1] = {"q4_1", 32, 2 + 2 + 16, 1},
    [KV_TYPE_Q5_0] = {"q5_0", 32, 2 + 4 + 16, 1},
    [KV_TYPE_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16, 1},
    [KV_TYPE_Q8_0] = {"q8_0", 32, 2 + 32, 1},
    [KV_TYPE_Q8_1] = {"q8_1", 32, 4 + 32, 1},
    [KV_TYPE_Q2_K] = {"q2_k", 256, 256 / 16 + 256 / 4 + 2 + 2, 0},
    [KV_TYPE_Q3_K] = {"q3_k", 256, 256 / 8 + 256 / 4 + 12 + 2, 0},
    [KV_TYPE_Q4_K] = {"q4_k", 256, 2 + 2 + 12 + 256 / 2, 1},
    [KV_TYPE_Q5_K] = {"q5_k", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2, 1},
    [KV_TYPE_Q6_K] = {"q6_k", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2, 1},
    [KV_TYPE_Q8_K] = {"q8_k", 256, 4 + 256 + 2 * 256 / 16, 1},
    [KV_TYPE_I8] = {"i8", 1, 1, 0},
    [KV_TYPE_I16] = {"i16", 1, 2, 0},
    [KV_TYPE_I32] = {"i32", 1, 4, 0},
    [KV_TYPE_I64] = {"i64", 1, 8, 0},
    [KV_TYPE_F64] = {"f64", 1, 8, 0},
    [KV_TYPE_BF16] = {"bf16", 1, 2, 1},
};

const kv_type_traits *kv_type_get(int t) {
    if (t < 0 || t >= KV_TYPE_COUNT || !traits[t].name) return NULL;
    return &traits[t];
}

const char *kv_type_name(int t) {
    const kv_type_traits *tr = kv_type_get(t);
    return tr ? tr->name : "unknown";
}

int kv_type_from_name(const char *name, kv_type *out) {
    if (!name) return -1;
    char low[16];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof low) return -1;
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
    for (int t = 0; t < KV_TYPE_COUNT; t++) {
        if (traits[t].name && strcmp(traits[t].name, low) == 0) {
            *out = (kv_type)t;
            return 0;
        }
    }
    return -1;
}

size_t kv_type_row_size(kv_type t, int64_t n) {
    const kv_type_traits *tr = kv_type_get(t);
    if (!tr || n < 0 || n % tr->blck_size) return 0;
    return (size_t)(n / tr->blck_size) * tr->type_size;
}

/* IEEE binary16 <-> binary32 with correct rounding, subnormals, inf, NaN. */
float kv_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kv_fp32_to_fp16(float f) { return kv_f32_to_f16_bits(f); }

float kv_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kv_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}
