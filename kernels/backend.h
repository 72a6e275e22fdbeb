/* backend.h - the backend table. The forward pass in engine/ calls only
 * these entry points, so the CPU backend, the CUDA backend and the simulated
 * GPU backend are interchangeable per profile (as ggml_backend_i is).
 *
 * Buffers passed to ops are the backend's own (from ops.alloc); for the CPU
 * backend they are plain host memory. Weights are kv_tensor views whose data
 * lives in the model file mapping (CPU) or a device copy (ops.upload_weight).
 *
 * The contract can fail: an op that cannot do its work records the failure
 * on the backend (the first one since the last status call is kept, with
 * the op's name), and ops.status hands it over. The forward pass asks once
 * per batch, so a failed op ends the requests of that batch with a reason
 * instead of producing wrong tokens. Scratch is sized once by ops.reserve
 * when the model and the batch limits are known; ops do not allocate. */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "types.h"

/* A 2-D weight matrix: ne1 rows of ne0 elements each, row-major, encoded in
 * `type` (GGUF blocks run along a row). */
typedef struct kv_tensor {
    kv_type type;
    int64_t ne0;       /* row length = input features */
    int64_t ne1;       /* number of rows = output features */
    size_t nb1;        /* bytes per row */
    const void *data;  /* borrowed: host bytes (file mapping or converted copy) */
    void *dev;         /* backend-private copy (CUDA), NULL on the CPU */
} kv_tensor;

/* Bytes a weight spans as stored: ne1 - 1 rows of nb1 bytes and the last
 * one to its row size; 0 for a tensor without rows. */
static inline size_t kv_tensor_span(const kv_tensor *w) {
    if (!w || w->ne1 <= 0) return 0;
    return (size_t)(w->ne1 - 1) * w->nb1 + kv_type_row_size(w->type, w->ne0);
}

/* A (rows, width) f32 activation buffer viewed as a tensor (for get_rows). */
static inline kv_tensor kv_tensor_f32(const float *p, int64_t width, int64_t rows) {
    return (kv_tensor){.type = KV_TYPE_F32, .ne0 = width, .ne1 = rows, .nb1 = (size_t)width * sizeof(float),
                       .data = p, .dev = (void *)p};
}

/* KV cache element formats. */
typedef enum kv_cache_dtype {
    KV_CACHE_F32 = 0,
    KV_CACHE_F16 = 1,
    KV_CACHE_INT8 = 2,       /* symmetric, one f32 scale per (token, head) row */
    KV_CACHE_INT8_ASYM = 3,  /* asymmetric, f32 scale + f32 min per row */
    KV_CACHE_FP8_E4M3 = 4,   /* fp8 with one f32 scale per row */
    KV_CACHE_FP8_E5M2 = 5,
    KV_CACHE_DTYPE_COUNT
} kv_cache_dtype;

const char *kv_cache_dtype_name(kv_cache_dtype d);
int kv_cache_dtype_from_name(const char *s, kv_cache_dtype *out); /* 0 or -1 */
/* Bytes one (token, kv head) row of head_dim elements takes, scales included. */
size_t kv_cache_row_bytes(kv_cache_dtype d, int head_dim);

/* The paged KV storage (vLLM's layout idea): for every layer a pool of
 * n_blocks blocks of block_size token slots; slot s = block * block_size +
 * offset. Owned by engine/kv_cache; kernels only read and write rows, found
 * with kv_pages_row_offset().
 *
 * NOTE: inside a block the rows are grouped by kv head, (n_kv_heads,
 * block_size, row_bytes), as vLLM does, not by token: one head's rows of a
 * block are then contiguous (16 x 128 bytes for f16, head_dim 64), so
 * decode attention, which reads one head at a time, streams them at memory
 * bandwidth; with the rows of a token side by side it read 128 bytes every
 * slot_bytes and reached a quarter of it. A block is still one contiguous
 * block_size * slot_bytes range per layer, so copy-on-write and swap move
 * whole blocks without knowing the order inside. */
typedef struct kv_pages {
    kv_cache_dtype dtype;
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;     /* tokens per block */
    int n_blocks;       /* physical blocks per layer */
    size_t row_bytes;   /* kv_cache_row_bytes(dtype, head_dim) */
    size_t slot_bytes;  /* n_kv_heads * row_bytes: one token's rows, all heads */
    size_t layer_bytes; /* n_blocks * block_size * slot_bytes */
    uint8_t *k;         /* (n_layers, n_blocks, n_kv_heads, block_size, row_bytes) */
    uint8_t *v;         /* same shape as k */
} kv_pages;

/* Fills kv's row_bytes, slot_bytes and layer_bytes from its dtype,
 * head_dim, n_kv_heads, block_size and n_blocks (the layout above). No
 * overflow check: a caller sizing pages from outside input checks first. */
static inline void kv_pages_set_sizes(kv_pages *kv) {
    kv->row_bytes = kv_cache_row_bytes(kv->dtype, kv->head_dim);
    kv->slot_bytes = (size_t)kv->n_kv_heads * kv->row_bytes;
    kv->layer_bytes = (size_t)kv->n_blocks * (size_t)kv->block_size * kv->slot_bytes;
}

/* Byte offset in kv->k (or kv->v) of the row of kv head `head` at position
 * `off` of block `blk` of `layer` (the layout: a block holds each head's
 * rows side by side). */
static inline size_t kv_pages_block_row_offset(const kv_pages *kv, int layer, int64_t blk, int off, int head) {
    return (size_t)layer * kv->layer_bytes +
           (((size_t)blk * (size_t)kv->n_kv_heads + (size_t)head) * (size_t)kv->block_size + (size_t)off) *
               kv->row_bytes;
}

/* The same for slot `slot` of `layer`. */
static inline size_t kv_pages_row_offset(const kv_pages *kv, int layer, int64_t slot, int head) {
    return kv_pages_block_row_offset(kv, layer, slot / kv->block_size, (int)(slot % kv->block_size), head);
}

/* Which tokens of a forward batch attend to what. Token i sits at position
 * pos[i] of sequence seq[i]; its K/V rows are written to physical slot
 * slot[i]; it attends causally to positions 0..pos[i] of its sequence,
 * found through tables[seq[i]] (logical block -> physical block). Tokens of
 * the same sequence in one batch have increasing positions. */
typedef struct kv_attn_batch {
    int n_tokens;
    const int32_t *pos;            /* (n_tokens) */
    const int32_t *seq;            /* (n_tokens) index into tables */
    const int32_t *slot;           /* (n_tokens) */
    int n_seqs;
    const int32_t *const *tables;  /* (n_seqs) each (ceil((max pos + 1) / block_size)) */
} kv_attn_batch;

typedef struct kv_backend kv_backend;

/* The most weights one matmul_multi call takes (Q, K and V). */
#define KV_MATMUL_MULTI_MAX 3

/* One group of a matmul_groups call: y[i](n, w[i].ne1) = x(n, K) . w[i]^T
 * for i < nw (1..KV_MATMUL_MULTI_MAX), the weights with rows of K =
 * w[0].ne0: a matmul_multi's arguments. */
typedef struct kv_matmul_group {
    const kv_tensor *w[KV_MATMUL_MULTI_MAX];
    float *y[KV_MATMUL_MULTI_MAX];
    int nw;
    const float *x;
    int n; /* rows of x, >= 1 */
} kv_matmul_group;

typedef struct kv_backend_mem {
    int valid;            /* 0: the backend cannot tell (print N/A) */
    uint64_t total_bytes; /* device memory, or the host budget */
    uint64_t used_bytes;
    uint64_t prepared_bytes; /* of used_bytes: copies of weights kept in the backend's own layout
                                (prepare_weight: the cpu backend's pre-packed panels) */
} kv_backend_mem;

/* What the ops of a backend must be ready for, known once the model and the
 * batch limits are (kv_forward_new asks for it). Ops called within these
 * limits do not allocate; an op asked for more records a failure. */
typedef struct kv_backend_limits {
    int max_rows;           /* activation rows of one op (tokens of a batch), >= 1 */
    int64_t max_k;          /* longest activation row a matmul reads (the largest
                               weight ne0), >= 1 */
    uint64_t weight_types;  /* bit t set: some matmul weight has kv_type t; 0:
                               any type (size for the most demanding) */
    /* attention's batch (0: not known to this caller; the engine, which
     * knows them, reserves them in a call of its own): */
    int max_seqs;           /* sequences in one batch */
    int max_blocks_per_seq; /* block-table entries of one sequence (its context in blocks) */
    /* rope's frequency table (rope_dim 0: none): the rotated dims per head
     * and the base the forward pass will ask for */
    int rope_dim;
    float rope_base;
} kv_backend_limits;

/* A backend that models a device's time instead of taking it (sim). */
struct kv_sim_device; /* sim_cost.h */
struct kv_sim_cost;   /* sim_cost.h */

typedef struct kv_backend_clock {
    const char *device; /* the modelled device ("h100-sxm"); static */
    double elapsed_s;   /* modelled device seconds of the ops so far */
    const struct kv_sim_device *model; /* the modelled device's figures (sim_cost.h); valid
                                          until the backend is freed */
} kv_backend_clock;

typedef struct kv_backend_ops {
    const char *name; /* "cpu", "cuda", "sim" */

    /* Buffers (activations, logits). alloc returns NULL on failure. */
    void *(*alloc)(kv_backend *b, size_t bytes);
    void (*free)(kv_backend *b, void *p);
    void (*upload)(kv_backend *b, void *dst, const void *src, size_t bytes);
    void (*download)(kv_backend *b, void *dst, const void *src, size_t bytes);
    /* Makes w usable by this backend (device copy); 0 or an error. */
    int (*upload_weight)(kv_backend *b, kv_tensor *w, kv_err *err);

    /* y(n, w.ne1) = x(n, w.ne0) . w^T, for every supported weight type.
     * Activations are quantized to 8 bits per block for quantized weights,
     * as GGUF engines do. Each weight row is read once for all n rows of x. */
    void (*matmul)(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n);
    /* out(n, w.ne0) = rows ids[0..n) of w, dequantized (embedding lookup). */
    void (*get_rows)(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n);
    /* out(n, dim) = x / rms(x) * weight, row by row. out may equal x. */
    void (*rmsnorm)(kv_backend *b, const float *x, const float *weight, float *out, int n, int dim,
                    float eps);
    /* Rotates x(n, n_heads, head_dim) in place by positions pos(n); the first
     * rot_dim of each head rotate; neox=0 pairs (2i, 2i+1), neox=1 pairs
     * (i, i + rot_dim/2). */
    void (*rope)(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                 int rot_dim, float base, int neox);
    /* gate = silu(gate) * up, elementwise over count floats. */
    void (*silu_mul)(kv_backend *b, float *gate, const float *up, int64_t count);
    /* x += y, elementwise. */
    void (*add)(kv_backend *b, float *x, const float *y, int64_t count);
    /* Writes k, v (n_tokens, n_kv_heads * head_dim) into their slots of layer. */
    void (*kv_store)(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab,
                     const float *k, const float *v);
    /* out(n_tokens, n_heads * head_dim) = softmax(q k^T * scale) v over each
     * token's causal context, read through the block tables (GQA: query head
     * h uses kv head h / (n_heads / n_kv_heads)). */
    void (*attention)(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                      const float *q, float *out, int n_heads, float scale);
    /* Copies physical block src to dst in every layer (copy-on-write, swap). */
    void (*copy_block)(kv_backend *b, kv_pages *kv, int dst, int src);

    void (*mem_info)(kv_backend *b, kv_backend_mem *out);
    void (*destroy)(kv_backend *b);

    /* NOTE: ops stay void and failures are sticky, read by status once per
     * forward batch, as CUDA reports errors: a device op fails after it was
     * queued, so a return code from the op itself could not carry it, and
     * one check per batch costs nothing per op (the CPU backend keeps the
     * same contract so callers need one code path). */

    /* The first failure of an op since the last call: waits for the work
     * queued so far (asynchronous backends), then returns 0 when every op
     * succeeded, or KV_ERR_BACKEND with err (may be NULL) saying
     * "<op>: <the backend's message>", and forgets it. Required. */
    int (*status)(kv_backend *b, kv_err *err);
    /* Sizes the backend's scratch for ops within *lim; reservations only
     * grow (the largest of all calls holds). 0, or KV_ERR_NOMEM / INVAL with
     * err filled, and then the earlier reservation stands. NULL: the backend
     * needs none. */
    int (*reserve)(kv_backend *b, const kv_backend_limits *lim, kv_err *err);
    /* Fills *out with the modelled device and its clock. NULL for backends
     * whose time is the host's (cpu, cuda). Safe from another thread than
     * the one running ops. */
    void (*clock)(kv_backend *b, kv_backend_clock *out);
    /* Charges the clock for ops that were not computed (a synthetic
     * model's, engine/synth_step.c): the costs c[0..n) on the modelled
     * device (sim_cost.h), one after the other, each with its launch cost
     * unless launch is 0. NULL for backends without a clock. */
    void (*charge)(kv_backend *b, const struct kv_sim_cost *c, int n, int launch);
    /* A synthetic model spread over devices: a storage-less KV block's
     * swap (upload / download with NULL buffers) and copy_block are charged
     * at share (0, 1] of its bytes, each device moving its own share over
     * its own link at once. NULL for backends without a clock. */
    void (*set_kv_share)(kv_backend *b, double share);

    /* Ops the architectures past llama need (gemma3, qwen2/3, phi3, Llama 3
     * RoPE scaling, sliding windows). NULL: the backend lacks the op, and
     * kv_forward_new refuses a model that needs it, naming the op. */
    /* gate = gelu_tanh(gate) * up, elementwise over count floats (GeGLU). */
    void (*gelu_mul)(kv_backend *b, float *gate, const float *up, int64_t count);
    /* x *= s, elementwise over count floats. */
    void (*scale)(kv_backend *b, float *x, float s, int64_t count);
    /* x(n, dim) += bias(dim) on every row (projection biases). */
    void (*add_rows)(kv_backend *b, float *x, const float *bias, int n, int dim);
    /* rope with the angle of pair i at position p being p * freq_scale *
     * base^(-2i/rot_dim) / freq_factors[i] (freq_factors (rot_dim/2) or
     * NULL for all ones: Llama 3's rope_freqs, linear scaling). */
    void (*rope_ext)(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                     float base, int neox, float freq_scale, const float *freq_factors);
    /* attention, where a token at position p sees only positions > p -
     * window (sliding-window layers); window <= 0 is plain causal. */
    void (*attention_window)(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                             const float *q, float *out, int n_heads, float scale, int window);

    /* Mixture of experts (qwen3moe; NULL: refused by kv_forward_new). */
    /* Routing of n tokens: for each row of logits (n, n_expert), softmax
     * over the experts, the k most probable (ties: lower expert first) into
     * ids (n, k) in decreasing order and their probabilities into weights
     * (n, k), divided by their sum (clamped below at 6.103515625e-5) when
     * norm. 1 <= k <= n_expert. */
    void (*moe_route)(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                      float *weights);
    /* x[rows[i]] += w[i] * y[i] for i in [0, n), rows of dim floats (the
     * weighted sum of the experts' output rows back into their tokens'
     * rows). A row of x may appear more than once (a token routed to
     * several experts): its additions happen in increasing i, one rounding
     * each, so the result does not depend on how the calls are split. */
    void (*scatter_add)(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n, int dim);
    /* y[i](n, w[i].ne1) = x(n, K) . w[i]^T for i < nw (1..KV_MATMUL_MULTI_MAX),
     * the weights all with rows of K = w[0].ne0 (types may differ): the nw
     * matmul calls, bit for bit, but x is quantized once per activation
     * format and the rows of all weights are split over the threads in one
     * pass (Q/K/V and gate/up of a decode step: one dispatch instead of
     * three or two). NULL: the caller makes the matmul calls. */
    void (*matmul_multi)(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y, int n);
    /* The ng (>= 1) groups' matmul_multi calls, each group its own x, bit
     * for bit, in as few passes as the scratch allows (one for a decode
     * step's experts): every x prepared first, then the rows of all the
     * groups' weights split over the threads at once. A mixture of
     * experts' gate/up (or down) matmuls of the experts a step routed to:
     * a few rows each, so one dispatch per expert cost more than its
     * arithmetic. NULL: kv_backend_matmul_groups makes the calls. */
    void (*matmul_groups)(kv_backend *b, const kv_matmul_group *g, int ng);
    /* Optional (NULL: nothing to do): makes, once, a layout of weight w
     * that this backend's kernels read faster (cpu: q8_0 as pre-packed
     * panels on AVX-512), kept until the backend is freed and found again
     * by w's data address: the caller keeps w's bytes unchanged and mapped
     * for the backend's lifetime (the engine: its model). Results do not
     * change. 0, or an error (then w is read as it is). */
    int (*prepare_weight)(kv_backend *b, const kv_tensor *w, kv_err *err);
    /* 1: alloc's buffers are plain host memory and every op takes host
     * pointers as its buffers, and download is a copy with nothing to
     * model: a caller may have an op write straight into its own host
     * memory instead of a buffer it then downloads (the forward pass's
     * logits: 33 MB a step for 32 Gemma 3 rows). 0: use download (cuda;
     * sim, whose download charges the modelled transfer). */
    int host_buffers;
    /* Optional (NULL: the caller scans the rows itself): for each of the n
     * rows of dim (>= 1) floats at x, in host memory (host_buffers
     * backends), ids[r] = the first index of its largest value, NaN never
     * taken and a NaN at index 0 kept (the engine's kv_argmax), and
     * finite[r] = 1 when the row holds no NaN or Inf, else 0. One pass over
     * the rows, spread over the backend's threads: greedy sampling's and
     * the finite-logits check's two passes over n x vocab floats on the
     * engine's thread (3.4 ms of Gemma 3's 32-row step). */
    void (*logits_scan)(kv_backend *b, const float *x, int n, int dim, int32_t *ids, uint8_t *finite);
} kv_backend_ops;

struct kv_backend {
    const kv_backend_ops *ops;
    int n_threads;
    void *ctx; /* backend-private state (thread pool, device handles) */
};

/* Creates a backend by name ("cpu", "cuda", "sim"). n_threads <= 0 means all
 * cores. Returns NULL with err filled when unknown or unavailable. */
kv_backend *kv_backend_create(const char *name, int n_threads, kv_err *err);
/* Same, with the device a backend models or drives: the sim backend's
 * device table name ("h100-sxm", "a100-80g", "l4", "rtx4090"); ignored by
 * the others. NULL or "" means the backend's default. */
kv_backend *kv_backend_create_on(const char *name, const char *device, int n_threads, kv_err *err);
void kv_backend_free(kv_backend *b); /* NULL is a no-op */
/* Names of the compiled-in backends, NULL-terminated. */
const char *const *kv_backend_names(void);

/* ops.status, NULL-safe: 0 for a NULL backend or one without the entry. */
int kv_backend_status(kv_backend *b, kv_err *err);
/* y[i] = x . w[i]^T for i < nw (<= KV_MATMUL_MULTI_MAX), one input: one
 * matmul_multi call (x prepared once, one dispatch) where b has the op, else
 * nw matmul calls; the same bits either way. */
void kv_backend_matmul_same_x(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y, int n);
/* The groups' matmuls: one matmul_groups call where b has the op, else a
 * kv_backend_matmul_same_x per group; the same bits either way. */
void kv_backend_matmul_groups(kv_backend *b, const kv_matmul_group *g, int ng);

/* ops.reserve, NULL-safe: 0 when the backend needs no reservation. */
int kv_backend_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err);
/* 1 and *out (OUT) filled when b models a device clock (ops.clock), else 0
 * and *out zeroed. */
int kv_backend_clock_get(kv_backend *b, kv_backend_clock *out);
/* ops.charge of n costs, NULL-safe: 0 when charged, KV_ERR_UNSUPPORTED when
 * b has no clock to charge. */
int kv_backend_charge(kv_backend *b, const struct kv_sim_cost *c, int n, int launch);
/* ops.set_kv_share, NULL-safe (a no-op for backends without it). */
void kv_backend_set_kv_share(kv_backend *b, double share);
/* kv_backend_create_on("sim", ...) for a device the caller describes (*d is
 * copied; its strings must outlive the backend). NULL with err when a
 * figure is out of range. */
kv_backend *kv_backend_create_model(const struct kv_sim_device *d, int n_threads, kv_err *err);

#endif
