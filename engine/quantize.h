/* quantize.h - rewrites a GGUF model with its weight matrices in another
 * encoding (what `kvtop quantize` runs), choosing each tensor's type with
 * llama.cpp's rules so the output looks like the files people download:
 *
 *  - only 2-D (or higher) tensors whose name ends in "weight" are converted;
 *    norms, biases and other 1-D tensors, expert routers (ffn_gate_inp) and
 *    position / token-type embeddings are copied unchanged;
 *  - for quantized targets, output.weight (or token_embd.weight when the
 *    output is tied to it) becomes Q6_K, or Q8_0 when the target is Q8_0 or
 *    its rows do not fit the target's block;
 *  - Q4_K_M / Q5_K_M: attn_v and ffn_down of the layers where
 *    use_more_bits(i, n) holds (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2)
 *    become Q6_K, attn_qkv becomes Q5_K (Q4_K_M) / Q6_K (Q5_K_M);
 *    Q4_K_S (TYPE q4_k): attn_v of the first 4 layers and ffn_down of the
 *    first n/8 become Q5_K;
 *  - a row length that is not a multiple of the chosen type's block falls
 *    back as llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and
 *    to F16 when even 32 does not divide it;
 *  - a tensor already in its target type is copied byte for byte; any other
 *    is dequantized to f32 (from F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 *    Q5_1, Q8_1, Q4_K, Q5_K, Q6_K) and quantized with the reference
 *    quantizers (no importance matrix);
 *  - metadata is copied, with general.file_type set to llama.cpp's ftype
 *    and general.quantization_version = 2. */
#ifndef KV_QUANTIZE_H
#define KV_QUANTIZE_H

#include <stdint.h>

#include "../kernels/types.h"
#include "../base/common.h"

/* What to produce: a base type and the rule set of a llama.cpp ftype. */
typedef struct kv_quant_target {
    const char *name;   /* canonical lower-case name: "q4_k_m" */
    kv_type base;       /* type of the ordinary weight matrices */
    uint32_t file_type; /* general.file_type (llama.cpp's llama_ftype) */
} kv_quant_target;

/* Parses a TYPE (case-insensitive): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
 * q5_1, q4_k (= q4_k_s), q4_k_m, q5_k (= q5_k_s), q5_k_m, q6_k.
 * Returns 0, or KV_ERR_INVAL (err names the type and lists valid ones). */
int kv_quant_target_from_name(const char *name, kv_quant_target *out, kv_err *err);
/* The accepted names, comma-separated (for usage text). */
const char *kv_quant_target_names(void);

/* Layer facts the mixes depend on. */
typedef struct kv_quant_model_info {
    int has_output;  /* the file has output.weight (else the output is tied to token_embd) */
    int n_layer;     /* {arch}.block_count, or 1 + the largest blk.N seen */
    int n_attn_v;    /* tensors named *attn_v.weight / *attn_qkv.weight */
} kv_quant_model_info;

/* The type tensor `name` (n_dims, ne, currently src) gets for target t.
 * i_attn_v: rank of this tensor among the attn_v/attn_qkv tensors (by layer),
 * i_ffn_down: its rank among the ffn_down tensors; ignored for other names.
 * *fallback (may be NULL) is set to 1 when the rows did not fit the first
 * choice. Pure function; no I/O. */
kv_type kv_quant_tensor_type(const kv_quant_target *t, const kv_quant_model_info *mi, const char *name,
                             int n_dims, const int64_t *ne, kv_type src, int i_attn_v, int i_ffn_down,
                             int *fallback);

/* Progress report: called after each chunk of rows is written (from the
 * calling thread). tensor / n_tensors: which tensor; bytes: output bytes of
 * converted tensors done so far / in total. */
typedef void (*kv_quant_progress_fn)(void *ctx, int64_t tensor, int64_t n_tensors, const char *name,
                                     uint64_t bytes_done, uint64_t bytes_total);

typedef struct kv_quantize_params {
    kv_quant_target target;
    int n_threads;                 /* <= 0: one per online core */
    kv_quant_progress_fn progress; /* may be NULL */
    void *progress_ctx;
    /* Per tensor, before it is written (may be NULL): what was decided. */
    void (*on_tensor)(void *ctx, const char *name, kv_type from, kv_type to, int fallback, int n_dims,
                      const int64_t *ne);
} kv_quantize_params;

typedef struct kv_quantize_stats {
    int64_t n_tensors;    /* tensors in the file */
    int64_t n_converted;  /* re-encoded */
    int64_t n_copied;     /* copied byte for byte */
    int64_t n_fallback;   /* rows did not fit the first choice */
    uint64_t bytes_in;    /* tensor data bytes in the input */
    uint64_t bytes_out;   /* tensor data bytes in the output */
    double seconds;       /* wall time */
} kv_quantize_stats;

/* Reads in_path, writes out_path (through out_path.tmp, renamed at the end,
 * so a failed run leaves no partial output). st (OUT, may be NULL).
 * Returns 0 or a negative code with err naming the file / tensor / type:
 * KV_ERR_IO, KV_ERR_FORMAT (bad input), KV_ERR_UNSUPPORTED (a tensor that
 * must be converted has a type kvtop cannot decode), KV_ERR_INVAL (same
 * input and output file, bad params), KV_ERR_NOMEM. */
int kv_quantize_file(const char *in_path, const char *out_path, const kv_quantize_params *p,
                     kv_quantize_stats *st, kv_err *err);

#endif
