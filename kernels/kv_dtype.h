/* kv_dtype.h - the KV cache's row formats: encode one (token, kv head) row
 * of head_dim floats into the cache element format and decode it back, plus
 * the OCP fp8 scalar conversions. The attention kernels of every backend
 * read these layouts, so they are spelled out here:
 *
 *   f32        float[head_dim]
 *   f16        uint16[head_dim]              IEEE binary16, round to nearest even
 *   int8       int8[head_dim],  f32 scale    x = q * scale,          scale = amax / 127
 *   int8_asym  uint8[head_dim], f32 scale,   x = min + q * scale,    scale = (max - min) / 255
 *                               f32 min
 *   fp8_e4m3   uint8[head_dim], f32 scale    x = e4m3(q) * scale,    scale = amax / 448
 *   fp8_e5m2   uint8[head_dim], f32 scale    x = e5m2(q) * scale,    scale = amax / 57344
 *
 * The f32 scale (and min) follow the element bytes at offset head_dim, in
 * host byte order, not necessarily 4-byte aligned (read them with memcpy).
 * The fp8 formats are OCP's: e4m3 has bias 7, no infinities and one NaN
 * pattern per sign (max 448); e5m2 is IEEE-like with bias 15 (max 57344).
 * Encoding saturates to the largest finite value and rounds to nearest even.
 * Rows of all zeros get scale 0 and decode to zeros. Where a row sits in
 * the paged cache is kv_pages_row_offset() in backend.h. */
#ifndef KV_KV_DTYPE_H
#define KV_KV_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Encodes src(head_dim) into one row of kv_cache_row_bytes(d, head_dim)
 * bytes at dst. Unknown d writes nothing. */
void kv_dtype_encode_row(kv_cache_dtype d, const float *src, void *dst, int head_dim);
/* Decodes one row at src into dst(head_dim). Unknown d writes zeros. */
void kv_dtype_decode_row(kv_cache_dtype d, const void *src, float *dst, int head_dim);
/* 1 when d stores a per-row scale (the quantized formats). */
int kv_dtype_is_quantized(kv_cache_dtype d);

/* OCP fp8 conversions (saturating, round to nearest even; NaN stays NaN). */
uint8_t kv_fp8_e4m3_from_fp32(float f);
float kv_fp8_e4m3_to_fp32(uint8_t v);
uint8_t kv_fp8_e5m2_from_fp32(float f);
float kv_fp8_e5m2_to_fp32(uint8_t v);

/* Largest finite magnitudes of the fp8 formats. */
#define KV_FP8_E4M3_MAX 448.0f
#define KV_FP8_E5M2_MAX 57344.0f

#endif
