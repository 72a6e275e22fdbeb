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

/* ---- state --------------------------------------------------------------- */

typedef struct sim_ctx {
    kv_backend *inner;          /* the cpu backend that computes */
    const kv_sim_device *dev;   /* a table entry, or &own */
    kv_sim_device own;          /* a caller's device (kv_sim_backend_create_custom) */
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
    double kv_share;            /* of a storage-less KV block's bytes, what one device moves (its KV
                                   heads and layers) while the others move theirs on their own links:
                                   kv_sim_set_kv_share; 1 by default */
} sim_ctx;

static sim_ctx *ctx_of(const kv_backend *b) { return (sim_ctx *)b->ctx; }
static kv_backend *in_of(const kv_backend *b) { return ctx_of(b)->inner; }

static void charge_s(sim_ctx *c, kv_sim_kind kind, double t, double bytes, double flops) {
    pthread_mutex_lock(&c->lock);
    c->elapsed_s += t;
    c->kind_s[kind] += t;
    c->kind_ops[kind]++;
    c->bytes += bytes;
    c->flops += flops;
    pthread_mutex_unlock(&c->lock);
}

static void charge_cost(kv_backend *b, kv_sim_cost k) {
    sim_ctx *c = ctx_of(b);
    charge_s(c, k.kind, kv_sim_roofline_peak_s(c->dev, k.bytes, k.flops, k.peak, 1), k.bytes, k.flops);
}

static void charge_transfer(kv_backend *b, size_t bytes) {
    sim_ctx *c = ctx_of(b);
    charge_s(c, KV_SIM_TRANSFER, (double)bytes / c->dev->link_bw + c->dev->launch_s, 0.0, 0.0);
}

void kv_sim_charge(kv_backend *b, const kv_sim_cost *k, int n, int launch) {
    if (!kv_sim_is(b) || !k) return;
    sim_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < n; i++) {
        if ((int)k[i].kind < 0 || k[i].kind >= KV_SIM_KIND_COUNT) continue;
        double t = kv_sim_cost_seconds(c->dev, &k[i], launch);
        int dev_traffic = k[i].kind != KV_SIM_TRANSFER && k[i].kind != KV_SIM_COMM;
        c->elapsed_s += t;
        c->kind_s[k[i].kind] += t;
        c->kind_ops[k[i].kind]++;
        if (dev_traffic) {
            c->bytes += k[i].bytes;
            c->flops += k[i].flops;
        }
    }
    pthread_mutex_unlock(&c->lock);
}

/* Bytes of a weight as stored: rows ne1 of nb1 bytes (the last one only to
 * its row size). 0 for a malformed tensor. */
static double tensor_bytes(const kv_tensor *w) { return (double)kv_tensor_span(w); }

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

/* NOTE: upload and download with NULL buffers move nothing and are charged:
 * a synthetic model's swap (its cache has no storage) costs what a real
 * one would. */
static void sim_upload(kv_backend *b, void *dst, const void *src, size_t bytes) {
    if (dst && src) in_of(b)->ops->upload(in_of(b), dst, src, bytes);
    charge_transfer(b, dst && src ? bytes : (size_t)(bytes * ctx_of(b)->kv_share + 0.5));
}

static void sim_download(kv_backend *b, void *dst, const void *src, size_t bytes) {
    if (dst && src) in_of(b)->ops->download(in_of(b), dst, src, bytes);
    charge_transfer(b, dst && src ? bytes : (size_t)(bytes * ctx_of(b)->kv_share + 0.5));
}

/* The host computes the results: its layouts, not the modelled device's. */
static int sim_prepare_weight(kv_backend *b, const kv_tensor *w, kv_err *err) {
    kv_backend *in = ctx_of(b)->inner;
    return in->ops->prepare_weight ? in->ops->prepare_weight(in, w, err) : KV_OK;
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
    out->prepared_bytes = 0; /* its device holds no prepared copies (the delegate's panels are host memory) */
    pthread_mutex_unlock(&c->lock);
}

/* ---- compute ops: delegate, then charge ----------------------------------- */

static void charge_matmul(kv_backend *b, const kv_tensor *w, int n) {
    note_weight(b, w);
    charge_cost(b, kv_sim_cost_matmul(tensor_bytes(w), (double)w->ne0, (double)w->ne1, n, KV_SIM_PEAK_BF16));
}

static void sim_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    in_of(b)->ops->matmul(in_of(b), w, x, y, n);
    if (!w || n <= 0) return;
    charge_matmul(b, w, n);
}

/* The inner backend's matmul_multi (or its matmuls), charged as the nw
 * separate matmuls it replaces: the modelled device's time does not change
 * with how the host batches its dispatches. */
static void sim_matmul_multi(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y,
                             int n) {
    kv_backend *in = in_of(b);
    if (in->ops->matmul_multi)
        in->ops->matmul_multi(in, w, nw, x, y, n);
    else
        for (int i = 0; w && y && i < nw; i++) in->ops->matmul(in, w[i], x, y[i], n);
    if (!w || n <= 0) return;
    for (int i = 0; i < nw && i < KV_MATMUL_MULTI_MAX; i++)
        if (w[i]) charge_matmul(b, w[i], n);
}

/* The inner backend's matmul_groups, charged as its separate matmuls. */
static void sim_matmul_groups(kv_backend *b, const kv_matmul_group *g, int ng) {
    kv_backend_matmul_groups(in_of(b), g, ng);
    for (int k = 0; g && k < ng; k++)
        for (int i = 0; g[k].n > 0 && i < g[k].nw && i < KV_MATMUL_MULTI_MAX; i++)
            if (g[k].w[i]) charge_matmul(b, g[k].w[i], g[k].n);
}

static void sim_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    in_of(b)->ops->get_rows(in_of(b), w, ids, out, n);
    if (!w || n <= 0) return;
    note_weight(b, w);
    charge_cost(b, kv_sim_cost_get_rows((double)kv_type_row_size(w->type, w->ne0), (double)w->ne0, n));
}

static void sim_rmsnorm(kv_backend *b, const float *x, const float *weight, float *out, int n, int dim, float eps) {
    in_of(b)->ops->rmsnorm(in_of(b), x, weight, out, n, dim, eps);
    if (n > 0 && dim > 0) charge_cost(b, kv_sim_cost_rmsnorm(n, dim));
}

static void sim_rope(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                     float base, int neox) {
    in_of(b)->ops->rope(in_of(b), x, pos, n, n_heads, head_dim, rot_dim, base, neox);
    if (n > 0 && n_heads > 0 && rot_dim > 0) charge_cost(b, kv_sim_cost_rope(n, n_heads, rot_dim));
}

static void sim_silu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    in_of(b)->ops->silu_mul(in_of(b), gate, up, count);
    if (count > 0) charge_cost(b, kv_sim_cost_silu_mul(count));
}

static void sim_add(kv_backend *b, float *x, const float *y, int64_t count) {
    in_of(b)->ops->add(in_of(b), x, y, count);
    if (count > 0) charge_cost(b, kv_sim_cost_add(count));
}

static void sim_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                         const float *v) {
    in_of(b)->ops->kv_store(in_of(b), kv, layer, ab, k, v);
    if (!kv || !ab || ab->n_tokens <= 0) return;
    charge_cost(b, kv_sim_cost_kv_store(ab->n_tokens, kv->n_kv_heads, kv->head_dim, (double)kv->row_bytes));
}

/* NOTE: the model is a paged flash-attention kernel: each sequence's K/V
 * rows are read once for all of its query tokens in the batch (their
 * longest context, or window), while every query token does its own
 * 4 * ctx * head_dim flops per head (q.k and p.v). */
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
    double flops, kv_rows;
    kv_sim_attention_sums(ab, n_heads, kv->head_dim, window, c->seq_ctx, &flops, &kv_rows);
    charge_cost(b, kv_sim_cost_attention(flops, kv_rows, ab->n_tokens, n_heads, kv->head_dim, (double)kv->slot_bytes,
                                         kv->block_size));
}

static void sim_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                          float *out, int n_heads, float scale) {
    in_of(b)->ops->attention(in_of(b), kv, layer, ab, q, out, n_heads, scale);
    charge_attention(b, kv, ab, n_heads, 0);
}

/* ---- the ops of the architectures past llama: delegate (the inner backend
 * is the cpu one, which has them all), then charge ------------------------ */

static void sim_attention_window(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                                 const float *q, float *out, int n_heads, float scale, int window) {
    in_of(b)->ops->attention_window(in_of(b), kv, layer, ab, q, out, n_heads, scale, window);
    charge_attention(b, kv, ab, n_heads, window);
}

static void sim_gelu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    in_of(b)->ops->gelu_mul(in_of(b), gate, up, count);
    if (count > 0) charge_cost(b, kv_sim_cost_gelu_mul(count));
}

static void sim_scale(kv_backend *b, float *x, float s, int64_t count) {
    in_of(b)->ops->scale(in_of(b), x, s, count);
    if (count > 0) charge_cost(b, kv_sim_cost_scale(count));
}

static void sim_add_rows(kv_backend *b, float *x, const float *bias, int n, int dim) {
    in_of(b)->ops->add_rows(in_of(b), x, bias, n, dim);
    if (n > 0 && dim > 0) charge_cost(b, kv_sim_cost_add_rows(n, dim));
}

static void sim_moe_route(kv_backend *b, const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                          float *weights) {
    in_of(b)->ops->moe_route(in_of(b), logits, n, n_expert, k, norm, ids, weights);
    if (n > 0 && n_expert > 0 && k > 0) charge_cost(b, kv_sim_cost_moe_route(n, n_expert, k));
}

static void sim_scatter_add(kv_backend *b, float *x, const float *y, const int32_t *rows, const float *w, int n,
                            int dim) {
    in_of(b)->ops->scatter_add(in_of(b), x, y, rows, w, n, dim);
    if (n > 0 && dim > 0) charge_cost(b, kv_sim_cost_scatter_add(n, dim));
}

static void sim_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                         float base, int neox, float freq_scale, const float *freq_factors) {
    in_of(b)->ops->rope_ext(in_of(b), x, pos, n, n_heads, head_dim, rot_dim, base, neox, freq_scale, freq_factors);
    if (n > 0 && n_heads > 0 && rot_dim > 0) charge_cost(b, kv_sim_cost_rope(n, n_heads, rot_dim));
}

/* NOTE: pages without storage (k == NULL: a synthetic model's cache, whose
 * blocks are bookkeeping only) are charged and not copied. */
static void sim_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    if (!kv) return;
    if (kv->k) in_of(b)->ops->copy_block(in_of(b), kv, dst, src);
    double share = kv->k ? 1.0 : ctx_of(b)->kv_share; /* each device copies its share of the block at once */
    charge_cost(b, kv_sim_cost_copy_block(kv->n_layers, kv->block_size, (double)kv->slot_bytes * share));
}

static void sim_set_kv_share(kv_backend *b, double share) {
    if (share > 0 && share <= 1) ctx_of(b)->kv_share = share;
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
    out->model = c->dev;
}

static void sim_charge(kv_backend *b, const kv_sim_cost *k, int n, int launch) { kv_sim_charge(b, k, n, launch); }

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
    .prepare_weight = sim_prepare_weight,
    .matmul = sim_matmul,
    .matmul_multi = sim_matmul_multi,
    .matmul_groups = sim_matmul_groups,
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
    .charge = sim_charge,
    .set_kv_share = sim_set_kv_share,
    .gelu_mul = sim_gelu_mul,
    .scale = sim_scale,
    .add_rows = sim_add_rows,
    .rope_ext = sim_rope_ext,
    .attention_window = sim_attention_window,
    .moe_route = sim_moe_route,
    .scatter_add = sim_scatter_add,
};

/* A sim backend on device d (a table entry when own is NULL, else a copy
 * of *own). */
static kv_backend *create(const kv_sim_device *d, const kv_sim_device *own, int n_threads, kv_err *err) {
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
    c->kv_share = 1.0;
    if (own) {
        c->own = *own;
        c->dev = &c->own;
    } else {
        c->dev = d;
    }
    b->ops = &sim_ops;
    b->ctx = c;
    b->n_threads = inner->n_threads;
    return b;
}

kv_backend *kv_sim_backend_create_device(const char *device, int n_threads, kv_err *err) {
    const kv_sim_device *d = kv_sim_device_find(device ? device : "h100-sxm");
    if (!d) {
        char known[512] = "";
        size_t len = 0;
        int nd = 0;
        const kv_sim_device *devices = kv_sim_devices(&nd);
        for (int i = 0; i < nd && len < sizeof known; i++)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", devices[i].name);
        kv_err_set(err, KV_ERR_INVAL, "sim backend: unknown device '%s' (known: %s)", device, known);
        return NULL;
    }
    return create(d, NULL, n_threads, err);
}

kv_backend *kv_sim_backend_create_custom(const kv_sim_device *d, int n_threads, kv_err *err) {
    if (!d || !d->name || !d->label) {
        kv_err_set(err, KV_ERR_INVAL, "sim backend: a custom device needs a name and a label");
        return NULL;
    }
    const struct {
        const char *what;
        double v;
    } pos[] = {{"memory bandwidth", d->mem_bw}, {"tensor FLOP/s", d->tensor_flops}, {"vector FLOP/s", d->vector_flops},
               {"host link bandwidth", d->link_bw}, {"memory", (double)d->mem_bytes}};
    for (size_t i = 0; i < KV_ARRAY_LEN(pos); i++)
        if (!(pos[i].v > 0) || pos[i].v > 1e30) {
            kv_err_set(err, KV_ERR_INVAL, "sim backend: device '%s': %s must be positive (got %g)", d->name,
                       pos[i].what, pos[i].v);
            return NULL;
        }
    if (!(d->bw_frac > 0 && d->bw_frac <= 1) || !(d->flops_frac > 0 && d->flops_frac <= 1) || !(d->launch_s >= 0) ||
        !(d->usd_per_hour >= 0) || !(d->fp8_flops >= 0) || !(d->int8_flops >= 0) || !(d->peer_bw >= 0) ||
        !(d->peer_latency_s >= 0)) {
        kv_err_set(err, KV_ERR_INVAL,
                   "sim backend: device '%s': fractions must be in (0, 1] and launch, price, peaks and links >= 0",
                   d->name);
        return NULL;
    }
    return create(NULL, d, n_threads, err);
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
