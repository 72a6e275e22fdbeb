/* types.h - tensor element types with GGUF's exact on-disk block layouts,
 * their traits, and the row conversion / dot-product entry points that the
 * matmul kernels and the quantizer build on.
 *
 * The enum values are GGML's type ids, so a GGUF tensor's type field maps to
 * kv_type with a range check and no table. */
#ifndef KV_TYPES_H
#define KV_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef enum kv_type {
    KV_TYPE_F32 = 0,
    KV_TYPE_F16 = 1,
    KV_TYPE_Q4_0 = 2,
    KV_TYPE_Q4_1 = 3,
    KV_TYPE_Q5_0 = 6,
    KV_TYPE_Q5_1 = 7,
    KV_TYPE_Q8_0 = 8,
    KV_TYPE_Q8_1 = 9,
    KV_TYPE_Q2_K = 10,
    KV_TYPE_Q3_K = 11,
    KV_TYPE_Q4_K = 12,
    KV_TYPE_Q5_K = 13,
    KV_TYPE_Q6_K = 14,
    KV_TYPE_Q8_K = 15,
    KV_TYPE_I8 = 24,
    KV_TYPE_I16 = 25,
    KV_TYPE_I32 = 26,
    KV_TYPE_I64 = 27,
    KV_TYPE_F64 = 28,
    KV_TYPE_BF16 = 30,
    KV_TYPE_COUNT = 40 /* upper bound of GGML ids we know about */
} kv_type;

/* Traits of one type. blck_size elements are stored in type_size bytes. */
typedef struct kv_type_traits {
    const char *name;   /* "f32", "q4_0", ... (lower case, as GGUF tools print) */
    int blck_size;      /* elements per block (1 for plain types) */
    size_t type_size;   /* bytes per block */
    int supported;      /* 1 when kvtop can dequantize and matmul it */
} kv_type_traits;

/* Traits for type t, or NULL when t is not a GGML type id we know. */
const kv_type_traits *kv_type_get(int t);
/* Name of t ("q8_0"), or "unknown". */
const char *kv_type_name(int t);
/* Parses a name ("Q8_0", "q8_0", "f16") into *out. Returns 0 or -1. */
int kv_type_from_name(const char *name, kv_type *out);
/* Bytes of a row of n elements of type t; 0 when n is not a multiple of the
 * block size or t is unknown. */
size_t kv_type_row_size(kv_type t, int64_t n);

/* Half-precision conversions (IEEE binary16 and bfloat16). */
float kv_fp16_to_fp32(uint16_t h);
uint16_t kv_fp32_to_fp16(float f);
float kv_bf16_to_fp32(uint16_t h);
uint16_t kv_fp32_to_bf16(float f);

/* Dequantizes a row of n elements (n a multiple of the block size).
 * Returns 0, or -1 when the type is unsupported. */
int kv_dequantize_row(kv_type t, const void *src, float *dst, int64_t n);
/* Quantizes a row of n floats into type t (reference rounding, as GGUF
 * tools do). Returns 0, or -1 when the type is unsupported or n does not fit
 * the block size. */
int kv_quantize_row(kv_type t, const float *src, void *dst, int64_t n);

#endif
