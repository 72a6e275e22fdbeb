/* quant_ext.h - the GGUF block types beyond the basic set: Q5_0, Q5_1, Q8_1
 * and the K-quants Q4_K, Q5_K, Q6_K (with Q8_K, their activation type):
 * exact dequantizers, reference-quality quantizers (ggml's iterative scale
 * search), and dot products of one weight row with activations quantized
 * to the matching 8-bit type, scalar (the oracle) and AVX2 / AVX-512 VNNI
 * chosen at run time.
 *
 * A matmul that meets a weight type it does not know asks kv_qext_get(t)
 * for its ops, quantizes each activation row once with quantize_act_row
 * (into ops->vec_type blocks) and calls vec_dot per (weight row, activation
 * row). All functions here are pure: no allocation, no state, any thread. */
#ifndef KV_QUANT_EXT_H
#define KV_QUANT_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"

#define KV_QK_K 256 /* elements per K-quant super-block */

/* Block layouts, byte for byte as ggml stores them (little endian; every
 * field is 1 or 2 bytes wide, except q8_K's float, so there is no padding).
 * Blocks may sit at any byte offset inside a file mapping: code here reads
 * the 2-byte fields with memcpy and uses the structs for offsets and sizes. */
typedef struct kv_block_q5_0 {
    uint16_t d;      /* fp16 scale */
    uint8_t qh[4];   /* bit j of the little-endian u32 = 5th bit of element j */
    uint8_t qs[16];  /* element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j-16] */
} kv_block_q5_0;     /* value = (q - 16) * d, q in [0, 31] */

typedef struct kv_block_q5_1 {
    uint16_t d;      /* fp16 scale */
    uint16_t m;      /* fp16 minimum */
    uint8_t qh[4];   /* as q5_0 */
    uint8_t qs[16];  /* as q5_0 */
} kv_block_q5_1;     /* value = q * d + m */

typedef struct kv_block_q8_1 {
    uint16_t d;      /* fp16 scale */
    uint16_t s;      /* fp16 of d * sum(qs): lets q4_1/q5_1 dots add the min term in O(1) */
    int8_t qs[32];   /* value = qs[j] * d */
} kv_block_q8_1;

/* Super-block of 256 in 8 sub-blocks of 32. scales[12] packs eight 6-bit
 * scales sc[j] and eight 6-bit mins m[j]: for j < 4 sc = scales[j] & 63,
 * m = scales[j+4] & 63; for j >= 4 sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4,
 * m = (scales[j+4] >> 4) | (scales[j] >> 6) << 4. Sub-block pair (2g, 2g+1)
 * for g in 0..3 lives in qs[32g .. 32g+31]: sub-block 2g in the low nibbles,
 * 2g+1 in the high nibbles. value = d * sc[j] * q - dmin * m[j]. */
typedef struct kv_block_q4_K {
    uint16_t d;           /* fp16 super-block scale for the 6-bit scales */
    uint16_t dmin;        /* fp16 super-block scale for the 6-bit mins */
    uint8_t scales[12];   /* packed 6-bit scales and mins */
    uint8_t qs[128];      /* 4-bit quants */
} kv_block_q4_K;

/* As q4_K plus a 5th bit: element 64g + l (l < 32) takes bit 2g of qh[l],
 * element 64g + 32 + l takes bit 2g+1 of qh[l]. */
typedef struct kv_block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];       /* high bits */
    uint8_t qs[128];      /* low 4 bits, as q4_K */
} kv_block_q5_K;

/* 16 sub-blocks of 16 with int8 scales. For each half h (128 elements),
 * with L = ql + 64h, H = qh + 32h, l < 32:
 *   q[128h + l]      = (L[l] & 15)      | ((H[l] >> 0) & 3) << 4
 *   q[128h + l + 32] = (L[l + 32] & 15) | ((H[l] >> 2) & 3) << 4
 *   q[128h + l + 64] = (L[l] >> 4)      | ((H[l] >> 4) & 3) << 4
 *   q[128h + l + 96] = (L[l + 32] >> 4) | ((H[l] >> 6) & 3) << 4
 * value = d * scales[e / 16] * (q - 32). */
typedef struct kv_block_q6_K {
    uint8_t ql[128];      /* low 4 bits */
    uint8_t qh[64];       /* high 2 bits */
    int8_t scales[16];    /* sub-block scales */
    uint16_t d;           /* fp16 super-block scale */
} kv_block_q6_K;

/* The activation type for K-quant dots. */
typedef struct kv_block_q8_K {
    float d;              /* scale (f32) */
    int8_t qs[256];       /* value = qs[j] * d */
    int16_t bsums[16];    /* sums of qs over each group of 16 */
} kv_block_q8_K;

_Static_assert(sizeof(kv_block_q5_0) == 22, "q5_0 block is 22 bytes");
_Static_assert(sizeof(kv_block_q5_1) == 24, "q5_1 block is 24 bytes");
_Static_assert(sizeof(kv_block_q8_1) == 36, "q8_1 block is 36 bytes");
_Static_assert(sizeof(kv_block_q4_K) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(kv_block_q5_K) == 176, "q5_K block is 176 bytes");
_Static_assert(sizeof(kv_block_q6_K) == 210, "q6_K block is 210 bytes");
_Static_assert(sizeof(kv_block_q8_K) == 292, "q8_K block is 292 bytes");

/* Dot product of n elements: one weight row w (the ops' type) with one
 * activation row a (ops->vec_type). n is a multiple of the weight block size
 * (the caller checks once, outside the hot loop). */
typedef float (*kv_qext_dot_fn)(int64_t n, const void *w, const void *a);
/* Many dots at once: nr weight rows (row r at w + r * ws) against na
 * activation rows (row j at a + j * as), y[j * ys + r] = the dot of row r
 * with row j, each exactly what that type's vec_dot at the same ISA level
 * returns (bit for bit, whatever nr and na: batch invariance). Tiled so
 * that an activation block serves several weight rows and a weight block
 * several activation rows. K as for kv_qext_dot_fn. */
typedef void (*kv_qext_rows_fn)(int64_t K, const void *w, size_t ws, int nr, const void *a, size_t as, int na,
                                float *y, size_t ys);
/* Row conversions of n elements (n a multiple of the block size). */
typedef void (*kv_qext_to_f32_fn)(const void *src, float *dst, int64_t n);
typedef void (*kv_qext_from_f32_fn)(const float *src, void *dst, int64_t n);

typedef struct kv_qext_ops {
    kv_type type;                         /* weight type these ops handle */
    kv_type vec_type;                     /* activation block type vec_dot expects:
                                             Q8_0 (q5_0, q8_1), Q8_1 (q5_1), Q8_K (K-quants, q8_K) */
    int blck_size;                        /* elements per weight block (32 or 256) */
    kv_qext_to_f32_fn dequantize_row;     /* exact, as ggml's dequantize_row_* */
    kv_qext_from_f32_fn quantize_row;     /* reference quantizer (what GGUF tools write) */
    kv_qext_from_f32_fn quantize_act_row; /* f32 activations -> vec_type blocks */
    kv_qext_dot_fn vec_dot;               /* fastest path this CPU runs */
    kv_qext_dot_fn vec_dot_ref;           /* scalar reference, the test oracle */
    kv_qext_rows_fn rows;                 /* tiles of vec_dot at its level; NULL: call vec_dot per output */
} kv_qext_ops;

/* Ops for t (Q5_0, Q5_1, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K), or NULL for any
 * other type (those are quant.c's). Borrowed, static, valid forever. The
 * first call picks the SIMD level (thread-safe). */
const kv_qext_ops *kv_qext_get(kv_type t);

/* Picks the best dot-product ISA for this CPU (once; idempotent and
 * thread-safe). The types above are marked supported in kernels/types.c's
 * traits table, which is constant. */
void kv_qext_init(void);

/* Quantizes n activations into vec_type blocks (Q8_0, Q8_1 or Q8_K), the
 * way ggml's reference quantizers do. Returns 0, or -1 for another type or
 * an n that is not a multiple of the block size. */
int kv_qext_quantize_act(kv_type vec_type, const float *src, void *dst, int64_t n);

/* Instruction-set levels, numbered like matmul.h's kv_cpu_isa. */
typedef enum kv_qext_isa {
    KV_QEXT_ISA_SCALAR = 0,
    KV_QEXT_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KV_QEXT_ISA_AVX512 = 2  /* AVX-512 F/BW/VL + VNNI (+ AVX2/FMA/F16C) */
} kv_qext_isa;

/* 1 when this build has the path and this CPU runs it. */
int kv_qext_isa_available(kv_qext_isa isa);
/* The level kv_qext_get's vec_dot uses (the best available one). */
kv_qext_isa kv_qext_isa_best(void);
const char *kv_qext_isa_name(kv_qext_isa isa);
/* The dot of type t at exactly level isa (tests, benchmarks, a matmul that
 * forces a level), or NULL when t has no ops or the level is unavailable. */
kv_qext_dot_fn kv_qext_vec_dot_isa(kv_type t, kv_qext_isa isa);
/* The activation quantizer into vec_type at exactly level isa, bit for bit
 * the scalar one (level 0: Q8_0, Q8_1, Q8_K), or NULL where that level has
 * none of its own (kv_qext_get's quantize_act_row is then the scalar one).
 * Only Q8_K has a SIMD level (AVX-512). */
kv_qext_from_f32_fn kv_qext_quant_act_isa(kv_type vec_type, kv_qext_isa isa);
/* The tiled dots of type t at exactly level isa (matching
 * kv_qext_vec_dot_isa(t, isa) bit for bit), or NULL where that level has
 * none (then loop over the dot). */
kv_qext_rows_fn kv_qext_rows_isa(kv_type t, kv_qext_isa isa);

/* Pre-packed q4_K panels (the cpu backend's prepare_weight on AVX-512, as
 * matmul.h's q8_0 / q4 panels): 16 rows a panel, each super-block of them
 * one sequential run of KV_QK4_PANEL_SB bytes:
 *   0    the 16 rows' fp16 d, then their fp16 dmin (64 bytes)
 *   64   the 6-bit scales as bytes, [sub-block j][row] (128)
 *   192  the 6-bit mins as bytes, [sub-block j][row] (128)
 *   320  per sub-block j, 4 zmm of 16 rows x 4 bytes: byte i of row r in
 *        zmm g holds element 32j + 4g + i in its low nibble and 32j + 16 +
 *        4g + i in its high one (2048)
 * 2,368 bytes for the rows' 2,304: the scales unpacked once, not per row
 * and step as the row tiles must. Rows past M are zero. */
#define KV_QK4_PANEL_SB 2368
/* Bytes of one panel (16 rows) of a K-long weight of type t, or 0 when t
 * has no panels or K is not whole super-blocks. */
static inline size_t kv_qext_panel_stride(kv_type t, int64_t K) {
    return t == KV_TYPE_Q4_K && K > 0 && K % KV_QK_K == 0 ? (size_t)(K / KV_QK_K) * KV_QK4_PANEL_SB : 0;
}
/* Bytes of the panels of an (M, K) weight of type t, or 0 when t has none. */
size_t kv_qext_panel_bytes(kv_type t, int64_t K, int64_t M);
/* Packs panels [p0, p1) of the (M, K) rows w (stride ws) into dst (all the
 * panels, kv_qext_panel_bytes long). */
void kv_qext_panel_pack(kv_type t, const void *w, size_t ws, int64_t M, int64_t K, int64_t p0, int64_t p1,
                        uint8_t *dst);
/* nr rows (a multiple of 16 but for the weight's last panel) from the
 * panels at pp, against na activation rows: y as kv_qext_rows_fn, the
 * same bits as the rows' tiles at the same level. */
typedef void (*kv_qext_panels_fn)(int64_t K, const uint8_t *pp, int nr, const void *a, size_t as, int na, float *y,
                                  size_t ys);
/* The panel kernel of t at exactly level isa, or NULL. */
kv_qext_panels_fn kv_qext_panels_isa(kv_type t, kv_qext_isa isa);

#endif
