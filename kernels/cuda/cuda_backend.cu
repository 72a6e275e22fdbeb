/* cuda_backend.cu - the "cuda" backend's table: device memory, copies, the
 * per-op public layer (validates, turns host-side inputs into device
 * pointers, calls a launcher on the backend's stream, records failures), and
 * the caches that let the forward pass hand over host pointers where
 * backend.h allows them (weights from the model mapping, RMSNorm vectors,
 * positions and block tables). Kernels live in cuda_matmul.cu, cuda_ops.cu
 * and cuda_attention.cu; the host-copy table in cuda_copies.cu. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_internal.cuh"

/* A device buffer that only grows (scratch, staging). */
struct dev_buf {
    void *p;
    size_t cap; /* bytes */
};


/* One rope frequency table on the device (a target and a draft model may
 * differ), made by reserve, or by the first rope op that needs it. */
enum { ROPE_TABLES = 4 };
struct rope_table {
    int rot;        /* rotated dims per head; 0: empty */
    float base;
    dev_buf d;      /* (rot / 2) floats: inv_freq */
};

struct cuda_ctx {
    int device;
    cudaStream_t stream;           /* every op is queued here, in call order */
    char name[256];                /* device name, for messages */
    int err_code;                  /* first recorded failure, 0 when none */
    char err_op[32];               /* the op it happened in ("matmul") */
    char err_msg[512];
    const char *cur_op;            /* the op running now (static string), for the record */
    int sync_each;                 /* KVTOP_CUDA_SYNC=1: wait after every op, so a
                                      failing kernel is named by its op */
    kvc_copies copies;             /* device copies of host bytes (cuda_copies.cu) */
    dev_buf stage[STAGE_COUNT];    /* host inputs copied in (ids, positions, batch meta) */
    dev_buf xq, xd, xs;            /* q8 activations of a quantized matmul, sized by reserve */
    int32_t *hmeta;                /* (hmeta_cap) host side of the batch meta */
    size_t hmeta_cap;
    int32_t *seq_len, *seq_off;    /* (seq_cap) per-sequence table length / offset */
    int seq_cap;
    rope_table rope[ROPE_TABLES];  /* by (rot, base); the reserved ones come first */
    /* what reserve promised (0: nothing; the ops then grow on first use):
     * with meta_entries set, the batch meta of a batch within it never
     * allocates, and a batch past it fails instead */
    size_t res_rows;               /* activation rows (tokens of a batch) */
    int res_seqs, res_blocks;      /* sequences of a batch, table entries of one */
    size_t meta_entries;           /* 3 * res_rows + res_seqs * res_blocks */
};

static cuda_ctx *ctx_of(const kv_backend *b) { return (cuda_ctx *)b->ctx; }
static const rope_table *rope_table_for(cuda_ctx *c, int rot_dim, float base);
cudaStream_t kvc_stream(cuda_ctx *c) { return c->stream; }

/* ---- errors ---------------------------------------------------------------- */

/* Records a failure of the running op; the first one since the last status
 * call is kept (later ones are usually its consequences). The forward pass
 * reads it through ops.status after each batch. */
__attribute__((format(printf, 3, 4))) void kvc_fail(cuda_ctx *c, int code, const char *fmt, ...) {
    if (c->err_code) return;
    c->err_code = code;
    snprintf(c->err_op, sizeof c->err_op, "%s", c->cur_op ? c->cur_op : "cuda");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
}

/* 0 on success; else records what failed and returns -1. */
static int ck(cuda_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    kvc_fail(c, KV_ERR_BACKEND, "%s on %s: %s", what, c->name, cudaGetErrorString(e));
    return -1;
}

/* After an op's launch: records a launch failure and, with sync_each, an
 * execution failure under the op's name. */
int kvc_done(cuda_ctx *c, cudaError_t e, const char *what) {
    if (ck(c, e, what)) return -1;
    return c->sync_each ? ck(c, cudaStreamSynchronize(c->stream), what) : 0;
}

/* Makes this backend's device current for the calling thread (the engine
 * may run ops on another thread than the one that created the backend) and
 * names the op that runs now for the failure record. */
cuda_ctx *kvc_enter(kv_backend *b, const char *op) {
    cuda_ctx *c = ctx_of(b);
    c->cur_op = op;
    ck(c, cudaSetDevice(c->device), "cudaSetDevice");
    return c;
}

void kvc_nan_out(cuda_ctx *c, float *p, int64_t count) {
    if (p && count > 0) ck(c, kvc_launch_fill_nan(c->stream, p, count), "fill_nan");
}

/* ---- memory ----------------------------------------------------------------- */

/* 1 when p is device (or managed) memory, 0 for host memory. */
static int is_dev_ptr(const void *p) {
    cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* (not sticky; clear it) */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void *grow(cuda_ctx *c, dev_buf *d, size_t bytes, const char *what) {
    if (d->p && d->cap >= bytes) return d->p;
    size_t nc = (bytes + 4095) & ~(size_t)4095;
    if (nc < d->cap * 2 && d->cap * 2 > d->cap) nc = d->cap * 2;
    void *p = NULL;
    if (cudaMalloc(&p, nc) != cudaSuccess) {
        cudaGetLastError();
        kvc_fail(c, KV_ERR_NOMEM, "%s: cannot allocate %zu bytes on %s", what, nc, c->name);
        return NULL;
    }
    if (d->p) {
        ck(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize"); /* queued kernels may still read it */
        cudaFree(d->p);
    }
    d->p = p;
    d->cap = nc;
    return p;
}

/* The reserved buffer d when it holds bytes; else records the failure and
 * returns NULL (ops do not grow what reserve sized). */
static void *reserved(cuda_ctx *c, dev_buf *d, size_t bytes, const char *what) {
    if (d->p && d->cap >= bytes) return d->p;
    kvc_fail(c, KV_ERR_NOMEM, "%s: %zu bytes needed, %zu reserved (kv_backend_reserve)", what, bytes, d->cap);
    return NULL;
}

/* Device view of n bytes at p: p itself when it is device memory, else a
 * copy in staging slot `slot`. Stream order keeps a slot's previous reader
 * ahead of the next copy into it. NULL on failure (recorded). */
const void *kvc_stage_in(cuda_ctx *c, int slot, const void *p, size_t bytes) {
    if (is_dev_ptr(p)) return p;
    void *d = grow(c, &c->stage[slot], bytes, "staging");
    if (!d) return NULL;
    /* NOTE: from pageable memory the copy is staged by the driver before it
     * returns, so the caller may reuse its buffer at once. */
    if (ck(c, cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, c->stream), "cudaMemcpyAsync (staging)"))
        return NULL;
    return d;
}

/* Reports a failure into err when the caller takes one (upload_weight),
 * else records it on the backend (ops). */
__attribute__((format(printf, 4, 5))) static void report(cuda_ctx *c, kv_err *err, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (err)
        kv_err_set(err, code, "cuda backend: %s", msg);
    else
        kvc_fail(c, code, "%s", msg);
}

/* The device copy of `bytes` host bytes at host: the cached one unless it
 * is missing, too short, or refresh is set. NULL on failure (reported). */
static const void *host_copy_get(cuda_ctx *c, const void *host, size_t bytes, int refresh, kv_err *err) {
    kvc_copy *e = kvc_copy_find(&c->copies, host);
    if (e && e->dev && e->bytes >= bytes && !refresh) return e->dev;
    e = kvc_copy_slot(&c->copies, host);
    if (!e) {
        report(c, err, KV_ERR_NOMEM, "host copy cache: out of memory");
        return NULL;
    }
    if (!e->dev || e->bytes < bytes) {
        if (e->dev) {
            cudaStreamSynchronize(c->stream); /* queued kernels may still read the old copy */
            cudaFree(e->dev);
            e->dev = NULL;
            e->bytes = 0;
        }
        void *p = NULL;
        cudaError_t ce = cudaMalloc(&p, bytes ? bytes : 1);
        if (ce != cudaSuccess) {
            cudaGetLastError();
            report(c, err, KV_ERR_NOMEM, "cannot allocate %zu bytes on %s for a weight: %s", bytes, c->name,
                   cudaGetErrorString(ce));
            return NULL;
        }
        e->dev = p;
        e->bytes = bytes;
    }
    cudaError_t ce = bytes ? cudaMemcpyAsync(e->dev, host, bytes, cudaMemcpyHostToDevice, c->stream) : cudaSuccess;
    if (ce != cudaSuccess) {
        report(c, err, KV_ERR_BACKEND, "weight upload to %s: %s", c->name, cudaGetErrorString(ce));
        return NULL;
    }
    return e->dev;
}

static void *cu_alloc(kv_backend *b, size_t bytes) {
    kvc_enter(b, "alloc");
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is reported by the NULL; the context stays usable */
        return NULL;
    }
    return p;
}

static void cu_free(kv_backend *b, void *p) {
    if (!p) return;
    cuda_ctx *c = kvc_enter(b, "free");
    ck(c, cudaFree(p), "cudaFree");
}

static void cu_upload(kv_backend *b, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src || !dst || !src) return;
    cuda_ctx *c = kvc_enter(b, "upload");
    ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream), "upload");
}

static void cu_download(kv_backend *b, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src || !dst || !src) return;
    cuda_ctx *c = kvc_enter(b, "download");
    if (ck(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream), "download")) return;
    ck(c, cudaStreamSynchronize(c->stream), "download (sync)"); /* the host reads dst next */
}

static void cu_mem_info(kv_backend *b, kv_backend_mem *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    cuda_ctx *c = kvc_enter(b, "mem_info");
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return; /* valid = 0: the TUI prints N/A */
    }
    (void)c;
    out->valid = 1;
    out->total_bytes = tot;
    out->used_bytes = tot - fr;
}

/* ---- weights ------------------------------------------------------------------ */

static int is_q(kv_type t) { return t == KV_TYPE_Q8_0 || t == KV_TYPE_Q4_0 || t == KV_TYPE_Q4_1; }

/* What the kernels can read: 0, or an error naming the type or shape. */
static int check_weight(const kv_tensor *w, kv_err *err) {
    if (!w) return kv_err_set(err, KV_ERR_INVAL, "cuda backend: no weight tensor");
    if (!(w->type == KV_TYPE_F32 || w->type == KV_TYPE_F16 || w->type == KV_TYPE_BF16 || is_q(w->type)))
        return kv_err_set(err, KV_ERR_UNSUPPORTED,
                          "cuda backend: weight type %s (%d) is not supported (f32, f16, bf16, q8_0, q4_0, q4_1 are)",
                          kv_type_name((int)w->type), (int)w->type);
    if (w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT32_MAX || w->ne1 > INT32_MAX)
        return kv_err_set(err, KV_ERR_INVAL, "cuda backend: bad weight shape %lld x %lld", (long long)w->ne1,
                          (long long)w->ne0);
    size_t rs = kv_type_row_size(w->type, w->ne0);
    if (rs == 0)
        return kv_err_set(err, KV_ERR_INVAL, "cuda backend: row length %lld is not a multiple of the %s block size",
                          (long long)w->ne0, kv_type_name((int)w->type));
    if (w->nb1 < rs)
        return kv_err_set(err, KV_ERR_INVAL, "cuda backend: row stride %zu is below the row size %zu", w->nb1, rs);
    /* the kernels read f32 rows with 4-byte loads, blocks with 2-byte loads */
    if (w->nb1 % (w->type == KV_TYPE_F32 ? 4 : 2))
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "cuda backend: %s row stride %zu is not aligned",
                          kv_type_name((int)w->type), w->nb1);
    if (!w->data && !w->dev) return kv_err_set(err, KV_ERR_INVAL, "cuda backend: weight has no data");
    return KV_OK;
}

static size_t tensor_bytes(const kv_tensor *w) { return kv_tensor_span(w); }

/* Device bytes of w: its cached copy (by host address), w->dev (an
 * upload_weight copy or a view of a device buffer), w->data when that is
 * device memory, or else a copy made now and cached.
 * NOTE: the engine hands model weights over as host pointers into the file
 * mapping without calling upload_weight; the first use copies them. */
static const uint8_t *weight_ptr(cuda_ctx *c, const kv_tensor *w) {
    if (w->data) {
        const kvc_copy *e = kvc_copy_find(&c->copies, w->data);
        if (e && e->dev && e->bytes >= tensor_bytes(w)) return (const uint8_t *)e->dev;
    }
    if (w->dev) return (const uint8_t *)w->dev;
    if (is_dev_ptr(w->data)) return (const uint8_t *)w->data;
    return (const uint8_t *)host_copy_get(c, w->data, tensor_bytes(w), 0, NULL);
}

static int cu_upload_weight(kv_backend *b, kv_tensor *w, kv_err *err) {
    int rc = check_weight(w, err);
    if (rc) return rc;
    cuda_ctx *c = kvc_enter(b, "upload_weight");
    if (!w->data) return KV_OK; /* already a device view */
    if (is_dev_ptr(w->data)) {
        w->dev = (void *)w->data;
        return KV_OK;
    }
    kv_err e = {0, ""};
    const void *d = host_copy_get(c, w->data, tensor_bytes(w), 1, &e);
    if (!d)
        return kv_err_set(err, e.code ? e.code : KV_ERR_BACKEND, "%s (a %lld x %lld %s weight)", e.msg,
                          (long long)w->ne1, (long long)w->ne0, kv_type_name((int)w->type));
    w->dev = (void *)d;
    return KV_OK;
}

/* ---- ops ----------------------------------------------------------------------- */

static void cu_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    if (!w || !x || !y || n <= 0) return;
    cuda_ctx *c = kvc_enter(b, "matmul");
    kv_err e = {0, ""};
    if (check_weight(w, &e)) {
        kvc_fail(c, e.code, "matmul: %s", e.msg);
        if (w->ne1 > 0) kvc_nan_out(c, y, (int64_t)n * w->ne1);
        return;
    }
    const int64_t K = w->ne0, M = w->ne1;
    const uint8_t *wd = weight_ptr(c, w);
    if (!wd) {
        kvc_nan_out(c, y, (int64_t)n * M);
        return;
    }
    if (is_q(w->type)) {
        const size_t nblk = (size_t)n * (size_t)(K / KVC_QK);
        int8_t *xq = (int8_t *)reserved(c, &c->xq, (size_t)n * (size_t)K, "matmul activations");
        float *xd = (float *)reserved(c, &c->xd, nblk * sizeof(float), "matmul activations");
        float *xs = (float *)reserved(c, &c->xs, nblk * sizeof(float), "matmul activations");
        if (!xq || !xd || !xs) {
            kvc_nan_out(c, y, (int64_t)n * M);
            return;
        }
        if (kvc_done(c, kvc_launch_quantize_q8a(c->stream, x, n, K, xq, xd, xs), "quantize_q8a")) return;
        kvc_done(c, kvc_launch_matmul_q(c->stream, w->type, wd, w->nb1, M, K, xq, xd, xs, y, n), "matmul");
    } else {
        kvc_done(c, kvc_launch_matmul_f(c->stream, w->type, wd, w->nb1, M, K, x, y, n), "matmul");
    }
}

static void cu_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    if (!w || !ids || !out || n <= 0) return;
    cuda_ctx *c = kvc_enter(b, "get_rows");
    kv_err e = {0, ""};
    if (check_weight(w, &e)) {
        kvc_fail(c, e.code, "get_rows: %s", e.msg);
        if (w->ne0 > 0) kvc_nan_out(c, out, (int64_t)n * w->ne0);
        return;
    }
    const uint8_t *wd = weight_ptr(c, w);
    const int32_t *dids = (const int32_t *)kvc_stage_in(c, STAGE_IDS, ids, (size_t)n * sizeof(int32_t));
    if (!wd || !dids) {
        kvc_nan_out(c, out, (int64_t)n * w->ne0);
        return;
    }
    kvc_done(c, kvc_launch_get_rows(c->stream, w->type, wd, w->nb1, w->ne0, w->ne1, dids, out, n), "get_rows");
}

const float *kvc_host_vec(cuda_ctx *c, const float *p, size_t bytes) {
    const kvc_copy *e = kvc_copy_find(&c->copies, p);
    if (e && e->dev && e->bytes >= bytes) return (const float *)e->dev;
    if (is_dev_ptr(p)) return p;
    return (const float *)host_copy_get(c, p, bytes, 0, NULL);
}

static void cu_rmsnorm(kv_backend *b, const float *x, const float *weight, float *out, int n, int dim, float eps) {
    if (!x || !weight || !out || n <= 0 || dim <= 0) return;
    cuda_ctx *c = kvc_enter(b, "rmsnorm");
    /* NOTE: the forward pass passes RMSNorm weights as host pointers into
     * the model; they are copied once and cached by address (see
     * kv_cuda_forget_host_copies). Device pointers are used as they are. */
    const float *wd = kvc_host_vec(c, weight, (size_t)dim * sizeof(float));
    if (!wd) {
        kvc_nan_out(c, out, (int64_t)n * dim);
        return;
    }
    kvc_done(c, kvc_launch_rmsnorm(c->stream, x, wd, out, n, dim, eps), "rmsnorm");
}

/* The table for (rot_dim, base): a reserved or earlier one, else a new
 * one in a free slot (the last slot is reused when all are taken). NULL on
 * failure (recorded). */
const float *kvc_rope_freqs(cuda_ctx *c, int rot_dim, float base) {
    const rope_table *t = rope_table_for(c, rot_dim, base);
    return t ? (const float *)t->d.p : NULL;
}

static const rope_table *rope_table_for(cuda_ctx *c, int rot_dim, float base) {
    int slot = ROPE_TABLES - 1;
    for (int i = 0; i < ROPE_TABLES; i++) {
        if (c->rope[i].rot == rot_dim && c->rope[i].base == base) return &c->rope[i];
        if (c->rope[i].rot == 0 && slot == ROPE_TABLES - 1) slot = i;
    }
    for (int i = 0; i < ROPE_TABLES; i++)
        if (c->rope[i].rot == 0) {
            slot = i;
            break;
        }
    rope_table *t = &c->rope[slot];
    const int half = rot_dim / 2;
    float *h = (float *)malloc((size_t)half * sizeof(float));
    float *d = h ? (float *)grow(c, &t->d, (size_t)half * sizeof(float), "rope table") : NULL;
    if (!h) kvc_fail(c, KV_ERR_NOMEM, "rope: out of memory");
    if (!d) {
        free(h);
        return NULL;
    }
    /* the CPU backend's expression, evaluated by the same libm */
    for (int i = 0; i < half; i++) h[i] = powf(base, -(float)(2 * i) / (float)rot_dim);
    /* (a synchronous copy: h is freed right after) */
    int bad = ck(c, cudaMemcpyAsync(d, h, (size_t)half * sizeof(float), cudaMemcpyHostToDevice, c->stream),
                 "rope table upload") ||
              ck(c, cudaStreamSynchronize(c->stream), "rope table upload");
    free(h);
    if (bad) return NULL;
    t->rot = rot_dim;
    t->base = base;
    return t;
}

static void cu_rope(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                    float base, int neox) {
    /* Bad shapes are caller bugs; leave x unchanged (as the CPU does). */
    if (!x || !pos || n <= 0 || n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 ||
        !(base > 0.0f))
        return;
    cuda_ctx *c = kvc_enter(b, "rope");
    const rope_table *t = rope_table_for(c, rot_dim, base);
    if (!t) return;
    const int32_t *dpos = (const int32_t *)kvc_stage_in(c, STAGE_POS, pos, (size_t)n * sizeof(int32_t));
    if (!dpos) return;
    kvc_done(c, kvc_launch_rope(c->stream, x, dpos, (const float *)t->d.p, n, n_heads, head_dim, rot_dim, neox != 0),
       "rope");
}

static void cu_silu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    if (!gate || !up || count <= 0) return;
    cuda_ctx *c = kvc_enter(b, "silu_mul");
    kvc_done(c, kvc_launch_silu_mul(c->stream, gate, up, count), "silu_mul");
}

static void cu_add(kv_backend *b, float *x, const float *y, int64_t count) {
    if (!x || !y || count <= 0) return;
    cuda_ctx *c = kvc_enter(b, "add");
    kvc_done(c, kvc_launch_add(c->stream, x, y, count), "add");
}

/* The batch as the kernels read it (cuda_internal.cuh's KVC_META layout),
 * on the device. Slots outside the pool become -1 (not stored, as on the
 * CPU); with tables set, every table entry a token reaches is checked
 * against the pool, and a token whose table is bad gets offset -1 (its
 * output is NaN) with the failure recorded; tables == 2 (a sliding window)
 * lets entries be negative (blocks released below the window: the kernel
 * never reads them, and one it would read makes its output NaN). NULL on
 * failure. */
const int32_t *kvc_batch_meta(cuda_ctx *c, const kv_pages *kv, const kv_attn_batch *ab, int tables) {
    const int n = ab->n_tokens, bs = kv->block_size;
    const int64_t n_slots = (int64_t)kv->n_blocks * bs;
    size_t total = 3 * (size_t)n;
    if (c->meta_entries && (size_t)n > c->res_rows) {
        kvc_fail(c, KV_ERR_NOMEM, "batch meta: %d tokens, %zu reserved (kv_backend_reserve)", n, c->res_rows);
        return NULL;
    }
    if (tables) {
        if (c->meta_entries && ab->n_seqs > c->res_seqs) {
            kvc_fail(c, KV_ERR_NOMEM, "batch meta: %d sequences, %d reserved (kv_backend_reserve)", ab->n_seqs,
                 c->res_seqs);
            return NULL;
        }
        if (ab->n_seqs > c->seq_cap) {
            int32_t *l = (int32_t *)realloc(c->seq_len, (size_t)ab->n_seqs * sizeof(int32_t));
            if (l) c->seq_len = l;
            int32_t *o = l ? (int32_t *)realloc(c->seq_off, (size_t)ab->n_seqs * sizeof(int32_t)) : NULL;
            if (o) c->seq_off = o;
            if (!l || !o) {
                kvc_fail(c, KV_ERR_NOMEM, "attention: out of memory");
                return NULL;
            }
            c->seq_cap = ab->n_seqs;
        }
        for (int i = 0; i < n; i++) {
            const int s = ab->seq[i];
            if (s >= 0 && s < ab->n_seqs) c->seq_len[s] = 0;
        }
        for (int i = 0; i < n; i++) {
            const int s = ab->seq[i], p = ab->pos[i];
            if (s >= 0 && s < ab->n_seqs && p >= 0 && p / bs + 1 > c->seq_len[s]) c->seq_len[s] = p / bs + 1;
        }
        for (int i = 0; i < n; i++) { /* each sequence's table once */
            const int s = ab->seq[i];
            if (s >= 0 && s < ab->n_seqs && c->seq_len[s] > 0) {
                c->seq_off[s] = (int32_t)(total - 3 * (size_t)n);
                total += (size_t)c->seq_len[s];
                c->seq_len[s] = -c->seq_len[s]; /* negative: placed */
            }
        }
    }
    if (c->meta_entries && total > c->meta_entries) {
        kvc_fail(c, KV_ERR_NOMEM, "batch meta: %zu entries (block tables longer than %d blocks), %zu reserved "
             "(kv_backend_reserve)", total, c->res_blocks, c->meta_entries);
        return NULL;
    }
    if (total > c->hmeta_cap) {
        int32_t *h = (int32_t *)realloc(c->hmeta, total * sizeof(int32_t));
        if (!h) {
            kvc_fail(c, KV_ERR_NOMEM, "attention: out of memory");
            return NULL;
        }
        c->hmeta = h;
        c->hmeta_cap = total;
    }
    int32_t *m = c->hmeta;
    for (int i = 0; i < n; i++) {
        m[KVC_META_POS(n) + i] = ab->pos ? ab->pos[i] : 0; /* (kv_store does not need positions) */
        m[KVC_META_SLOT(n) + i] = ab->slot[i] >= 0 && ab->slot[i] < n_slots ? ab->slot[i] : -1;
        m[KVC_META_TAB(n) + i] = -1;
    }
    if (tables) {
        int32_t *tab = m + KVC_META_TABLES(n);
        for (int i = 0; i < n; i++) {
            const int s = ab->seq[i], p = ab->pos[i];
            if (s < 0 || s >= ab->n_seqs || p < 0 || !ab->tables || !ab->tables[s]) {
                kvc_fail(c, KV_ERR_RANGE, "attention: token %d has sequence %d of %d, position %d", i, s, ab->n_seqs, p);
                continue;
            }
            if (c->seq_len[s] < 0) { /* first token of s: copy and check its table */
                const int len = -c->seq_len[s];
                const int32_t *t = ab->tables[s];
                int ok = 1;
                for (int k = 0; k < len; k++) {
                    if ((t[k] < 0 && tables != 2) || t[k] >= kv->n_blocks) ok = 0;
                    tab[c->seq_off[s] + k] = t[k] < 0 ? -1 : t[k];
                }
                if (!ok) {
                    kvc_fail(c, KV_ERR_RANGE, "attention: sequence %d's block table points outside the pool of %d", s,
                         kv->n_blocks);
                    c->seq_off[s] = -1;
                }
                c->seq_len[s] = 0; /* done */
            }
            m[KVC_META_TAB(n) + i] = c->seq_off[s];
        }
    }
    return (const int32_t *)kvc_stage_in(c, STAGE_META, m, total * sizeof(int32_t));
}

static void cu_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                        const float *v) {
    if (!kv || !ab || ab->n_tokens <= 0 || !ab->slot || !k || !v || layer < 0 || layer >= kv->n_layers)
        return;
    cuda_ctx *c = kvc_enter(b, "kv_store");
    const int32_t *meta = kvc_batch_meta(c, kv, ab, 0);
    if (!meta) return;
    kvc_done(c, kvc_launch_kv_store(c->stream, *kv, layer, meta, ab->n_tokens, k, v), "kv_store");
}

static void cu_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                         float *out, int n_heads, float scale) {
    kvc_attention_window(b, kv, layer, ab, q, out, n_heads, scale, 0);
}

static void cu_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    if (!kv || dst == src || dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks) return;
    cuda_ctx *c = kvc_enter(b, "copy_block");
    /* A block is one contiguous run of block_size slots in each layer. */
    const size_t bb = (size_t)kv->block_size * kv->slot_bytes;
    for (int l = 0; l < kv->n_layers; l++) {
        const size_t base = (size_t)l * kv->layer_bytes;
        if (ck(c, cudaMemcpyAsync(kv->k + base + (size_t)dst * bb, kv->k + base + (size_t)src * bb, bb,
                                  cudaMemcpyDeviceToDevice, c->stream),
               "copy_block") ||
            ck(c, cudaMemcpyAsync(kv->v + base + (size_t)dst * bb, kv->v + base + (size_t)src * bb, bb,
                                  cudaMemcpyDeviceToDevice, c->stream),
               "copy_block"))
            return;
    }
}

/* ---- failures and sizing --------------------------------------------------------- */

/* Waits for the queued work (a kernel that failed while running is seen
 * here), then hands over the first failure and forgets it. */
static int take_failure(cuda_ctx *c, kv_err *err, int with_op) {
    const char *op = c->cur_op;
    c->cur_op = "kernel execution (KVTOP_CUDA_SYNC=1 names the op)";
    ck(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    c->cur_op = op;
    int code = c->err_code;
    if (code && with_op)
        kv_err_set(err, KV_ERR_BACKEND, "%s: %s", c->err_op, c->err_msg);
    else if (code)
        kv_err_set(err, code, "cuda backend: %s: %s", c->err_op, c->err_msg);
    c->err_code = 0;
    c->err_op[0] = c->err_msg[0] = '\0';
    return code;
}

static int cu_status(kv_backend *b, kv_err *err) {
    return take_failure(kvc_enter(b, "status"), err, 1) ? KV_ERR_BACKEND : 0;
}

/* The batch meta's host and device buffers and the per-sequence scratch
 * for n entries of s sequences. 0, or -1 (recorded). */
static int reserve_meta(cuda_ctx *c, size_t n, int s) {
    if (n > c->hmeta_cap) {
        int32_t *h = (int32_t *)realloc(c->hmeta, n * sizeof(int32_t));
        if (!h) return kvc_fail(c, KV_ERR_NOMEM, "batch meta: out of memory"), -1;
        c->hmeta = h;
        c->hmeta_cap = n;
    }
    if (s > c->seq_cap) {
        int32_t *l = (int32_t *)realloc(c->seq_len, (size_t)s * sizeof(int32_t));
        if (l) c->seq_len = l;
        int32_t *o = l ? (int32_t *)realloc(c->seq_off, (size_t)s * sizeof(int32_t)) : NULL;
        if (o) c->seq_off = o;
        if (!l || !o) return kvc_fail(c, KV_ERR_NOMEM, "batch meta: out of memory"), -1;
        c->seq_cap = s;
    }
    return grow(c, &c->stage[STAGE_META], n * sizeof(int32_t), "reserve") ? 0 : -1;
}

/* Everything an op within *lim needs, so that a forward pass allocates
 * nothing: the quantized matmul's activation buffers and the staging of
 * token ids and positions for lim->max_rows rows of lim->max_k; once the
 * engine gives the attention batch's bounds (max_seqs, max_blocks_per_seq),
 * the batch meta (positions, slots, block tables) for the largest batch
 * they allow; and the rope table for (rope_dim, rope_base). Reservations
 * only grow: each bound is the largest of all calls. */
static int cu_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    cuda_ctx *c = kvc_enter(b, "reserve");
    const size_t rows = (size_t)lim->max_rows, K = (size_t)(lim->max_k + KVC_QK - 1) / KVC_QK * KVC_QK;
    const size_t nblk = rows * (K / KVC_QK);
    size_t res_rows = KV_MAX(c->res_rows, rows);
    int res_seqs = KV_MAX(c->res_seqs, lim->max_seqs), res_blocks = KV_MAX(c->res_blocks, lim->max_blocks_per_seq);
    size_t meta = res_seqs > 0 && res_blocks > 0 ? 3 * res_rows + (size_t)res_seqs * (size_t)res_blocks : 0;
    if (!grow(c, &c->xq, rows * K, "reserve") || !grow(c, &c->xd, nblk * sizeof(float), "reserve") ||
        !grow(c, &c->xs, nblk * sizeof(float), "reserve") ||
        !grow(c, &c->stage[STAGE_IDS], res_rows * sizeof(int32_t), "reserve") ||
        !grow(c, &c->stage[STAGE_POS], res_rows * sizeof(int32_t), "reserve") ||
        (meta && reserve_meta(c, meta, res_seqs)) ||
        (lim->rope_dim > 0 && lim->rope_dim % 2 == 0 && lim->rope_base > 0.0f &&
         !rope_table_for(c, lim->rope_dim, lim->rope_base))) {
        kv_err e;
        take_failure(c, &e, 1);
        return kv_err_set(err, KV_ERR_NOMEM,
                          "cuda backend: cannot reserve scratch for %zu rows of %zu, %d sequences of %d blocks: %s",
                          res_rows, K, res_seqs, res_blocks, e.msg);
    }
    c->res_rows = res_rows;
    if (meta) {
        c->res_seqs = res_seqs;
        c->res_blocks = res_blocks;
        c->meta_entries = meta;
    }
    return KV_OK;
}

/* ---- lifecycle ------------------------------------------------------------------ */

static void cu_destroy(kv_backend *b) {
    if (!b) return;
    cuda_ctx *c = ctx_of(b);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        kvc_copies_drop(&c->copies);
        for (int i = 0; i < STAGE_COUNT; i++) cudaFree(c->stage[i].p);
        cudaFree(c->xq.p);
        cudaFree(c->xd.p);
        cudaFree(c->xs.p);
        for (int i = 0; i < ROPE_TABLES; i++) cudaFree(c->rope[i].d.p);
        if (c->stream) cudaStreamDestroy(c->stream);
        cudaGetLastError();
        free(c->hmeta);
        free(c->seq_len);
        free(c->seq_off);
        free(c);
    }
    free(b);
}

/* (positional: C++17 has no designated initializers; the order of backend.h) */
static const kv_backend_ops cuda_ops = {
    "cuda",           cu_alloc,   cu_free,     cu_upload,     cu_download,  cu_upload_weight,
    cu_matmul,        cu_get_rows, cu_rmsnorm, cu_rope,       cu_silu_mul,  cu_add,
    cu_kv_store,      cu_attention, cu_copy_block, cu_mem_info, cu_destroy,
    cu_status,        cu_reserve,  NULL, /* clock: host time */
    NULL,             /* charge: no modelled clock */
    NULL,             /* set_kv_share: no modelled clock */
    /* the ops of the architectures past llama (cuda_ext.cu) */
    kvc_gelu_mul,     kvc_scale,   kvc_add_rows, kvc_rope_ext, kvc_attention_window,
    /* the mixture-of-experts ops (cuda_moe.cu) */
    kvc_moe_route,    kvc_scatter_add,
    NULL,             /* matmul_multi: the engine makes one matmul call per weight */
    NULL,             /* matmul_groups: one matmul call per weight too */
    NULL,             /* prepare_weight: the weights are copied to the device as they are */
    0,                /* host_buffers: device memory */
    NULL,             /* logits_scan: the engine scans the downloaded rows */
};

extern "C" int kv_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" kv_backend *kv_cuda_backend_create(int n_threads, kv_err *err) {
    (void)n_threads;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        cudaGetLastError();
        kv_err_set(err, KV_ERR_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                   e != cudaSuccess ? cudaGetErrorString(e) : "the runtime sees 0 devices");
        return NULL;
    }
    int dev = 0;
    const char *env = getenv("KVTOP_CUDA_DEVICE");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v >= count) {
            kv_err_set(err, KV_ERR_INVAL, "KVTOP_CUDA_DEVICE=%s: expected a device index in [0, %d)", env, count);
            return NULL;
        }
        dev = (int)v;
    }
    kv_backend *b = (kv_backend *)calloc(1, sizeof *b);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        kv_err_set(err, KV_ERR_NOMEM, "cuda backend: out of memory");
        return NULL;
    }
    b->ops = &cuda_ops;
    b->ctx = c;
    b->n_threads = 1;
    c->device = dev;
    snprintf(c->name, sizeof c->name, "device %d", dev);
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        kv_err_set(err, KV_ERR_BACKEND, "cuda backend: device %d: %s", dev, cudaGetErrorString(e));
        cudaGetLastError();
        cu_destroy(b);
        return NULL;
    }
    snprintf(c->name, sizeof c->name, "%.200s (device %d, sm_%d%d)", prop.name, dev, prop.major, prop.minor);
    /* Probe: one tiny kernel, so a build without code for this GPU fails
     * here with a clear message instead of in the first forward pass. */
    float *probe = (float *)cu_alloc(b, sizeof(float));
    float host = 0.0f;
    if (!probe || ck(c, kvc_launch_fill_nan(c->stream, probe, 1), "probe kernel") ||
        ck(c, cudaMemcpyAsync(&host, probe, sizeof host, cudaMemcpyDeviceToHost, c->stream), "probe copy") ||
        ck(c, cudaStreamSynchronize(c->stream), "probe") || !isnan(host)) {
        kv_err_set(err, KV_ERR_BACKEND, "cuda backend: %s cannot run this build's kernels: %s", c->name,
                   c->err_msg[0] ? c->err_msg : "no device memory");
        if (probe) cudaFree(probe);
        cu_destroy(b);
        return NULL;
    }
    cudaFree(probe);
    const char *sync = getenv("KVTOP_CUDA_SYNC");
    c->sync_each = sync && *sync && strcmp(sync, "0");
    return b;
}

extern "C" int kv_cuda_last_error(kv_backend *b, kv_err *err) {
    if (!b || b->ops != &cuda_ops) return 0;
    return take_failure(kvc_enter(b, "last_error"), err, 0);
}

extern "C" void kv_cuda_forget_host_copies(kv_backend *b) {
    if (!b || b->ops != &cuda_ops) return;
    cuda_ctx *c = kvc_enter(b, "forget_host_copies");
    ck(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    kvc_copies_drop(&c->copies);
}
