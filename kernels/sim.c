/* sim.c - the "sim" backend: every op is delegated to an inner cpu backend
 * (so results are the CPU's, bit for bit) and charged to a simulated clock
 * by a roofline model of a chosen GPU; memory is accounted against the
 * device's capacity. See sim.h for the model. */
#include "sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cpu.h"
#include "types.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Vendor datasheet figures (dense; the datasheets' larger tensor numbers
 * assume 2:4 structured sparsity and are halved here):
 *   H100 SXM5 80GB: HBM3 3.35 TB/s, BF16 tensor 989 TFLOP/s, FP32 67 TFLOP/s,
 *                   PCIe Gen5 x16 128 GB/s both ways.
 *   A100 80GB SXM:  HBM2e 2,039 GB/s, BF16 tensor 312 TFLOP/s, FP32 19.5
 *                   TFLOP/s, PCIe Gen4 x16 64 GB/s both ways.
 *   L4:             GDDR6 300 GB/s, BF16 tensor 121 TFLOP/s, FP32 30.3
 *                   TFLOP/s, PCIe Gen4 x16 64 GB/s both ways, 24 GB.
 *   GeForce RTX 4090: GDDR6X 1,008 GB/s, BF16 tensor with FP32 accumulate
 *                   165.2 TFLOP/s (Ada whitepaper), FP32 82.6 TFLOP/s,
 *                   PCIe Gen4 x16, 24 GB.
 * NOTE: memory sizes are taken as GiB (what the tools print is close to
 * it), and the 4 us per-op launch cost is an assumption (measured kernel
 * launch plus dependency overheads are a few microseconds), not a datasheet
 * figure. */
static const kv_sim_device devices[] = {
    {"h100-sxm", "NVIDIA H100 SXM5 80GB", 3.35e12, 989e12, 67e12, 64e9, 4e-6, (uint64_t)(80 * GIB)},
    {"a100-80g", "NVIDIA A100 80GB SXM", 2.039e12, 312e12, 19.5e12, 32e9, 4e-6, (uint64_t)(80 * GIB)},
    {"l4", "NVIDIA L4 24GB", 300e9, 121e12, 30.3e12, 32e9, 4e-6, (uint64_t)(24 * GIB)},
    {"rtx4090", "NVIDIA GeForce RTX 4090 24GB", 1.008e12, 165.2e12, 82.6e12, 32e9, 4e-6, (uint64_t)(24 * GIB)},
};

static const struct {
    const char *alias, *name;
} aliases[] = {{"h100", "h100-sxm"}, {"a100", "a100-80g"}};

const kv_sim_device *kv_sim_devices(int *count) {
    if (count) *count = (int)KV_ARRAY_LEN(devices);
    return devices;
}

const kv_sim_device *kv_sim_device_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < KV_ARRAY_LEN(aliases); i++)
        if (!strcasecmp(name, aliases[i].alias)) name = aliases[i].name;
    for (size_t i = 0; i < KV_ARRAY_LEN(devices); i++)
        if (!strcasecmp(name, devices[i].name)) return &devices[i];
    return NULL;
}

double kv_sim_roofline_s(const kv_sim_device *d, double bytes, double flops, int tensor) {
    if (!d) return 0.0;
    double tm = bytes / d->mem_bw, tc = flops / (tensor ? d->tensor_flops : d->vector_flops);
    return (tm > tc ? tm : tc) + d->launch_s;
}

static const char *const kind_names[KV_SIM_KIND_COUNT] = {"matmul", "attention", "other", "transfer"};

const char *kv_sim_kind_name(kv_sim_kind k) {
    return (int)k >= 0 && k < KV_SIM_KIND_COUNT ? kind_names[k] : "unknown";
}

/* ---- state --------------------------------------------------------------- */

typedef struct sim_ctx {
    kv_backend *inner;          /* the cpu backend that computes */
    const kv_sim_device *dev;
    pthread_mutex_t lock;       /* guards the counters below (stats are read from other threads) */
    double elapsed_s;
    double kind_s[KV_SIM_KIND_COUNT];
    uint64_t kind_ops[KV_SIM_KIND_COUNT];
    double bytes, flops;
    uint64_t used;              /* simulated device bytes: buffers + resident weights */
    /* Weights counted as resident, by host data pointer (open addressing,
     * power-of-two capacity, at most half full), so tied or shared tensors
     * count once. */
    const void **wkeys;
    size_t wcap, wcount;
    int32_t *seq_ctx;           /* (seq_cap) per-sequence scratch for the attention model,
                                   sized by reserve */
    int seq_cap;
    char err[200];              /* the sim's own first failure since status ("" none) */
} sim_ctx;

static sim_ctx *ctx_of(const kv_backend *b) { return (sim_ctx *)b->ctx; }
static kv_backend *in_of(const kv_backend *b) { return ctx_of(b)->inner; }

static void charge(kv_backend *b, kv_sim_kind kind, double bytes, double flops, int tensor) {
    sim_ctx *c = ctx_of(b);
    double t = kv_sim_roofline_s(c->dev, bytes, flops, tensor);
    pthread_mutex_lock(&c->lock);
    c->elapsed_s += t;
    c->kind_s[kind] += t;
    c->kind_ops[kind]++;
    c->bytes += bytes;
    c->flops += flops;
    pthread_mutex_unlock(&c->lock);
}

static void charge_transfer(kv_backend *b, size_t bytes) {
    sim_ctx *c = ctx_of(b);
    double t = (double)bytes / c->dev->link_bw + c->dev->launch_s;
    pthread_mutex_lock(&c->lock);
    c->elapsed_s += t;
    c->kind_s[KV_SIM_TRANSFER] += t;
    c->kind_ops[KV_SIM_TRANSFER]++;
    pthread_mutex_unlock(&c->lock);
}

/* Bytes of a weight as stored: rows ne1 of nb1 bytes (the last one only to
 * its row size). 0 for a malformed tensor. */
static double tensor_bytes(const kv_tensor *w) {
    if (!w || w->ne1 <= 0) return 0.0;
    size_t rs = kv_type_row_size(w->type, w->ne0);
    return (double)(w->ne1 - 1) * (double)w->nb1 + (double)rs;
}

static size_t wslot(const sim_ctx *c, const void *key) {
    uintptr_t h = (uintptr_t)key;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 7) & (c->wcap - 1);
}

static int wset_has(const sim_ctx *c, const void *key) {
    if (!c->wcap) return 0;
    for (size_t i = wslot(c, key); c->wkeys[i]; i = (i + 1) & (c->wcap - 1))
        if (c->wkeys[i] == key) return 1;
    return 0;
}

/* Adds key to the weight set. Returns 1 when it was new, 0 when present,
 * -1 when memory ran out (then nothing changed). */
static int wset_add(sim_ctx *c, const void *key) {
    if (wset_has(c, key)) return 0;
    if (c->wcap && (c->wcount + 1) * 2 <= c->wcap) {
        size_t i = wslot(c, key);
        while (c->wkeys[i]) i = (i + 1) & (c->wcap - 1);
        c->wkeys[i] = key;
        c->wcount++;
        return 1;
    }
    size_t ncap = c->wcap ? c->wcap * 2 : 64;
    const void **nk = calloc(ncap, sizeof *nk);
    if (!nk) return -1;
    const void **ok = c->wkeys;
    size_t ocap = c->wcap;
    c->wkeys = nk;
    c->wcap = ncap;
    c->wcount = 0;
    for (size_t i = 0; i < ocap; i++)
        if (ok[i]) wset_add(c, ok[i]);
    free(ok);
    return wset_add(c, key);
}

/* A weight used by an op without upload_weight: count it as resident (a
 * real device would hold it). Activation views (dev set) are buffers,
 * already counted. */
static void note_weight(kv_backend *b, const kv_tensor *w) {
    sim_ctx *c = ctx_of(b);
    if (!w || w->dev || !w->data) return;
    pthread_mutex_lock(&c->lock);
    if (wset_add(c, w->data) == 1) c->used += (uint64_t)tensor_bytes(w);
    pthread_mutex_unlock(&c->lock);
}

/* ---- memory -------------------------------------------------------------- */

/* Each buffer carries a 64-byte header with its size, so free() can give
 * the simulated bytes back; the inner allocation is 64-byte aligned, so the
 * payload stays so. */
#define HDR 64

static void *sim_alloc(kv_backend *b, size_t bytes) {
    sim_ctx *c = ctx_of(b);
    if (bytes > SIZE_MAX - HDR) return NULL;
    pthread_mutex_lock(&c->lock);
    int fits = (uint64_t)bytes <= c->dev->mem_bytes && c->used <= c->dev->mem_bytes - (uint64_t)bytes;
    if (fits) c->used += bytes; /* reserve first: the device is full when it is full */
    pthread_mutex_unlock(&c->lock);
    if (!fits) return NULL;
    uint8_t *p = c->inner->ops->alloc(c->inner, bytes + HDR);
    if (!p) {
        pthread_mutex_lock(&c->lock);
        c->used -= bytes;
        pthread_mutex_unlock(&c->lock);
        return NULL;
    }
    uint64_t sz = bytes;
    memcpy(p, &sz, sizeof sz);
    return p + HDR;
}

static void sim_free(kv_backend *b, void *ptr) {
    if (!ptr) return;
    sim_ctx *c = ctx_of(b);
    uint8_t *p = (uint8_t *)ptr - HDR;
    uint64_t sz;
    memcpy(&sz, p, sizeof sz);
    pthread_mutex_lock(&c->lock);
    c->used -= sz;
    pthread_mutex_unlock(&c->lock);
    c->inner->ops->free(c->inner, p);
}

static void sim_upload(kv_backend *b, void *dst, const void *src, size_t bytes) {
    in_of(b)->ops->upload(in_of(b), dst, src, bytes);
    charge_transfer(b, bytes);
}

static void sim_download(kv_backend *b, void *dst, const void *src, size_t bytes) {
    in_of(b)->ops->download(in_of(b), dst, src, bytes);
    charge_transfer(b, bytes);
}

static int sim_upload_weight(kv_backend *b, kv_tensor *w, kv_err *err) {
    sim_ctx *c = ctx_of(b);
    int rc = c->inner->ops->upload_weight(c->inner, w, err);
    if (rc) return rc;
    uint64_t bytes = (uint64_t)tensor_bytes(w);
    pthread_mutex_lock(&c->lock);
    int fresh = 0;
    if (w->data) {
        /* check capacity first, commit second */
        if (!wset_has(c, w->data) && (bytes > c->dev->mem_bytes || c->used > c->dev->mem_bytes - bytes)) {
            pthread_mutex_unlock(&c->lock);
            return kv_err_set(err, KV_ERR_NOMEM,
                              "sim backend: weight of %.1f MiB does not fit the %s (%.1f of %.1f GiB in use)",
                              (double)bytes / (1 << 20), c->dev->name, (double)c->used / GIB,
                              (double)c->dev->mem_bytes / GIB);
        }
        fresh = wset_add(c, w->data);
        if (fresh == 1) c->used += bytes;
    }
    pthread_mutex_unlock(&c->lock);
    if (fresh < 0) return kv_err_set(err, KV_ERR_NOMEM, "sim backend: out of memory");
    charge_transfer(b, (size_t)bytes);
    return KV_OK;
}

static void sim_mem_info(kv_backend *b, kv_backend_mem *out) {
    if (!out) return;
    sim_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    out->valid = 1;
    out->total_bytes = c->dev->mem_bytes;
    out->used_bytes = c->used;
    pthread_mutex_unlock(&c->lock);
}

/* ---- compute ops: delegate, then charge ----------------------------------- */

static void sim_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    in_of(b)->ops->matmul(in_of(b), w, x, y, n);
    if (!w || n <= 0) return;
    note_weight(b, w);
    /* Weights are read once for all n rows (the op's contract); x read, y
     * written in f32. */
    double K = (double)w->ne0, M = (double)w->ne1;
    double bytes = tensor_bytes(w) + (double)n * K * 4.0 + (double)n * M * 4.0;
    charge(b, KV_SIM_MATMUL, bytes, 2.0 * n * K * M, 1);
}

static void sim_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    in_of(b)->ops->get_rows(in_of(b), w, ids, out, n);
    if (!w || n <= 0) return;
    note_weight(b, w);
    double rs = (double)kv_type_row_size(w->type, w->ne0);
    charge(b, KV_SIM_OTHER, (double)n * (rs + 4.0 * (double)w->ne0 + 4.0), (double)n * (double)w->ne0, 0);
}

static void sim_rmsnorm(kv_backend *b, const float *x, const float *weight, float *out, int n, int dim, float eps) {
    in_of(b)->ops->rmsnorm(in_of(b), x, weight, out, n, dim, eps);
    if (n <= 0 || dim <= 0) return;
    double e = (double)n * dim;
    charge(b, KV_SIM_OTHER, 8.0 * e + 4.0 * dim, 4.0 * e, 0);
}

static void sim_rope(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                     float base, int neox) {
    in_of(b)->ops->rope(in_of(b), x, pos, n, n_heads, head_dim, rot_dim, base, neox);
    if (n <= 0 || n_heads <= 0 || rot_dim <= 0) return;
    double e = (double)n * n_heads * rot_dim; /* rotated elements: read and written */
    charge(b, KV_SIM_OTHER, 8.0 * e + 4.0 * n, 3.0 * e, 0);
}

static void sim_silu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    in_of(b)->ops->silu_mul(in_of(b), gate, up, count);
    if (count > 0) charge(b, KV_SIM_OTHER, 12.0 * (double)count, 5.0 * (double)count, 0);
}

static void sim_add(kv_backend *b, float *x, const float *y, int64_t count) {
    in_of(b)->ops->add(in_of(b), x, y, count);
    if (count > 0) charge(b, KV_SIM_OTHER, 12.0 * (double)count, (double)count, 0);
}

static void sim_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                         const float *v) {
    in_of(b)->ops->kv_store(in_of(b), kv, layer, ab, k, v);
    if (!kv || !ab || ab->n_tokens <= 0) return;
    double rows = (double)ab->n_tokens * kv->n_kv_heads; /* per K and V */
    double bytes = 2.0 * rows * (4.0 * kv->head_dim + (double)kv->row_bytes);
    charge(b, KV_SIM_ATTENTION, bytes, 2.0 * rows * kv->head_dim * 2.0, 0);
}

/* NOTE: the model is a paged flash-attention kernel: each sequence's K/V
 * rows are read once for all of its query tokens in the batch (their
 * longest context), while every query token does its own 4 * ctx * head_dim
 * flops per head (q.k and p.v). */
static void charge_attention(kv_backend *b, const kv_pages *kv, const kv_attn_batch *ab, int n_heads, int window) {
    if (!kv || !ab || ab->n_tokens <= 0 || n_heads <= 0 || !ab->pos || !ab->seq) return;
    sim_ctx *c = ctx_of(b);
    if (ab->n_seqs > c->seq_cap) {
        /* the result is right, but the clock cannot charge this op */
        if (!c->err[0])
            snprintf(c->err, sizeof c->err, "attention: %d sequences in a batch, the clock was reserved for %d",
                     ab->n_seqs, c->seq_cap);
        return;
    }
    double flops = 0.0, kv_rows = 0.0;
    for (int i = 0; i < ab->n_tokens; i++) {
        int s = ab->seq[i];
        if (s >= 0 && s < ab->n_seqs) c->seq_ctx[s] = 0;
    }
    for (int i = 0; i < ab->n_tokens; i++) {
        int s = ab->seq[i];
        const int32_t seen = window > 0 ? KV_MIN(ab->pos[i] + 1, window) : ab->pos[i] + 1;
        flops += (double)seen * n_heads * (4.0 * kv->head_dim + 5.0); /* + the softmax's few flops per score */
        if (s >= 0 && s < ab->n_seqs && seen > c->seq_ctx[s]) c->seq_ctx[s] = seen;
    }
    for (int i = 0; i < ab->n_tokens; i++) { /* each sequence once */
        int s = ab->seq[i];
        if (s >= 0 && s < ab->n_seqs && c->seq_ctx[s] > 0) {
            kv_rows += c->seq_ctx[s];
            c->seq_ctx[s] = 0;
        }
    }
    double bytes = 2.0 * kv_rows * (double)kv->slot_bytes + 2.0 * ab->n_tokens * n_heads * kv->head_dim * 4.0 +
                   kv_rows / kv->block_size * 4.0;
    charge(b, KV_SIM_ATTENTION, bytes, flops, 1);
}

static void sim_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                          float *out, int n_heads, float scale) {
    in_of(b)->ops->attention(in_of(b), kv, layer, ab, q, out, n_heads, scale);
    charge_attention(b, kv, ab, n_heads, 0);
}

/* ---- the ops of the architectures past llama: delegate (the inner backend
 * is the cpu one, which has them all), then charge ------------------------ */

/* NOTE: a windowed sequence is charged its longest window's rows (a
 * sliding-window kernel reads only those). */
static void sim_attention_window(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                                 const float *q, float *out, int n_heads, float scale, int window) {
    in_of(b)->ops->attention_window(in_of(b), kv, layer, ab, q, out, n_heads, scale, window);
    charge_attention(b, kv, ab, n_heads, window);
}

static void sim_gelu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    in_of(b)->ops->gelu_mul(in_of(b), gate, up, count);
    if (count > 0) charge(b, KV_SIM_OTHER, 12.0 * (double)count, 10.0 * (double)count, 0);
}

static void sim_scale(kv_backend *b, float *x, float s, int64_t count) {
    in_of(b)->ops->scale(in_of(b), x, s, count);
    if (count > 0) charge(b, KV_SIM_OTHER, 8.0 * (double)count, (double)count, 0);
}

static void sim_add_rows(kv_backend *b, float *x, const float *bias, int n, int dim) {
    in_of(b)->ops->add_rows(in_of(b), x, bias, n, dim);
    if (n > 0 && dim > 0) charge(b, KV_SIM_OTHER, 8.0 * n * (double)dim + 4.0 * dim, (double)n * dim, 0);
}

static void sim_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                         float base, int neox, float freq_scale, const float *freq_factors) {
    in_of(b)->ops->rope_ext(in_of(b), x, pos, n, n_heads, head_dim, rot_dim, base, neox, freq_scale, freq_factors);
    if (n <= 0 || n_heads <= 0 || rot_dim <= 0) return;
    double e = (double)n * n_heads * rot_dim;
    charge(b, KV_SIM_OTHER, 8.0 * e + 4.0 * n, 3.0 * e, 0);
}

static void sim_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    in_of(b)->ops->copy_block(in_of(b), kv, dst, src);
    if (!kv) return;
    double blk = (double)kv->block_size * (double)kv->slot_bytes;
    charge(b, KV_SIM_OTHER, 2.0 * 2.0 * kv->n_layers * blk, 0.0, 0); /* K and V, read and written */
}

/* ---- failures, sizing, the clock ----------------------------------------- */

/* The sim's own failure first (the clock's), else the inner backend's. */
static int sim_status(kv_backend *b, kv_err *err) {
    sim_ctx *c = ctx_of(b);
    kv_err inner;
    kv_err_clear(&inner);
    int rc = kv_backend_status(c->inner, &inner); /* read (and cleared) either way */
    if (c->err[0]) {
        kv_err_set(err, KV_ERR_BACKEND, "%s", c->err);
        c->err[0] = '\0';
        return KV_ERR_BACKEND;
    }
    if (rc) return kv_err_set(err, KV_ERR_BACKEND, "%s", inner.msg);
    return 0;
}

/* The inner backend's scratch, and the attention model's per-sequence
 * table: a batch has at most one sequence per row. */
static int sim_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    sim_ctx *c = ctx_of(b);
    if (lim->max_rows > c->seq_cap) {
        int32_t *p = realloc(c->seq_ctx, (size_t)lim->max_rows * sizeof *p);
        if (!p) return kv_err_set(err, KV_ERR_NOMEM, "sim backend: out of memory");
        c->seq_ctx = p;
        c->seq_cap = lim->max_rows;
    }
    return kv_backend_reserve(c->inner, lim, err);
}

static void sim_clock(kv_backend *b, kv_backend_clock *out) {
    sim_ctx *c = ctx_of(b);
    out->device = c->dev->name;
    out->elapsed_s = kv_sim_elapsed_s(b);
}

/* ---- lifecycle ----------------------------------------------------------- */

static void sim_destroy(kv_backend *b) {
    if (!b) return;
    sim_ctx *c = ctx_of(b);
    if (c) {
        kv_backend_free(c->inner);
        pthread_mutex_destroy(&c->lock);
        free(c->wkeys);
        free(c->seq_ctx);
        free(c);
    }
    free(b);
}

static const kv_backend_ops sim_ops = {
    .name = "sim",
    .alloc = sim_alloc,
    .free = sim_free,
    .upload = sim_upload,
    .download = sim_download,
    .upload_weight = sim_upload_weight,
    .matmul = sim_matmul,
    .get_rows = sim_get_rows,
    .rmsnorm = sim_rmsnorm,
    .rope = sim_rope,
    .silu_mul = sim_silu_mul,
    .add = sim_add,
    .kv_store = sim_kv_store,
    .attention = sim_attention,
    .copy_block = sim_copy_block,
    .mem_info = sim_mem_info,
    .destroy = sim_destroy,
    .status = sim_status,
    .reserve = sim_reserve,
    .clock = sim_clock,
    .gelu_mul = sim_gelu_mul,
    .scale = sim_scale,
    .add_rows = sim_add_rows,
    .rope_ext = sim_rope_ext,
    .attention_window = sim_attention_window,
};

kv_backend *kv_sim_backend_create_device(const char *device, int n_threads, kv_err *err) {
    const kv_sim_device *d = kv_sim_device_find(device ? device : "h100-sxm");
    if (!d) {
        char known[256] = "";
        size_t len = 0;
        for (size_t i = 0; i < KV_ARRAY_LEN(devices) && len < sizeof known; i++)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", devices[i].name);
        kv_err_set(err, KV_ERR_INVAL, "sim backend: unknown device '%s' (known: %s)", device, known);
        return NULL;
    }
    kv_backend *inner = kv_cpu_backend_create(n_threads, err);
    if (!inner) return NULL;
    kv_backend *b = calloc(1, sizeof *b);
    sim_ctx *c = calloc(1, sizeof *c);
    if (!b || !c || pthread_mutex_init(&c->lock, NULL) != 0) {
        free(b);
        free(c);
        kv_backend_free(inner);
        kv_err_set(err, KV_ERR_NOMEM, "sim backend: out of memory");
        return NULL;
    }
    c->inner = inner;
    c->dev = d;
    b->ops = &sim_ops;
    b->ctx = c;
    b->n_threads = inner->n_threads;
    return b;
}

kv_backend *kv_sim_backend_create(int n_threads, kv_err *err) {
    return kv_sim_backend_create_device(NULL, n_threads, err);
}

int kv_sim_is(const kv_backend *b) { return b && b->ops == &sim_ops; }

kv_backend *kv_sim_inner(kv_backend *b) { return kv_sim_is(b) ? in_of(b) : NULL; }

double kv_sim_elapsed_s(kv_backend *b) {
    if (!kv_sim_is(b)) return 0.0;
    sim_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    double t = c->elapsed_s;
    pthread_mutex_unlock(&c->lock);
    return t;
}

void kv_sim_reset(kv_backend *b) {
    if (!kv_sim_is(b)) return;
    sim_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    c->elapsed_s = 0.0;
    memset(c->kind_s, 0, sizeof c->kind_s);
    memset(c->kind_ops, 0, sizeof c->kind_ops);
    c->bytes = c->flops = 0.0;
    pthread_mutex_unlock(&c->lock);
}

void kv_sim_stats_get(kv_backend *b, kv_sim_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!kv_sim_is(b)) return;
    sim_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    out->valid = 1;
    out->device = c->dev;
    out->elapsed_s = c->elapsed_s;
    memcpy(out->kind_s, c->kind_s, sizeof out->kind_s);
    memcpy(out->kind_ops, c->kind_ops, sizeof out->kind_ops);
    out->bytes = c->bytes;
    out->flops = c->flops;
    out->used_bytes = c->used;
    pthread_mutex_unlock(&c->lock);
}
