/* cpu.c - the "cpu" backend table and everything it owns: host buffers,
 * the thread pool, the ISA choice, the scratch that ops.reserve sizes, the
 * failure record that ops.status reads, and the element-wise ops
 * (get_rows, rmsnorm, rope, silu_mul, add) with their scalar references.
 * The matmul kernels live in matmul*.c, the KV-cache kernels in
 * cpu_attention*.c, the element-wise AVX2 paths in cpu_avx2.c; they get the
 * pool, the ISA and the scratch as arguments (cpu_internal.h). */
#include "cpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <unistd.h>

#include "cpu_attention.h"
#include "cpu_moe.h"
#include "cpu_internal.h"
#include "quant_ext.h"

/* Element-wise ops go parallel above this many elements. */
#define KV_CPU_MIN_PAR_ELEMS (1 << 16)
#define KV_ROPE_MAX_PAIRS 1024
/* Floats of attention's split states (kv_attn_run_split): 1 MiB takes a
 * decode token of 9 heads of 64 at 200K context, or 32 tokens at 6K. */
#define KV_CPU_ATTN_PART (1 << 18)

typedef struct cpu_ctx {
    kv_threadpool *pool;
    int n_threads;
    kv_cpu_isa isa;
    void *scratch[KV_CPU_MAX_THREADS]; /* per-thread scratch, scratch_cap bytes each */
    size_t scratch_cap;                /* bytes per thread (0: nothing reserved) */
    void *act;                         /* shared activation scratch */
    size_t act_cap;                    /* bytes of one region (KV_MATMUL_MULTI_MAX of them) */
    atomic_ullong used;                /* bytes held by alloc() and scratch */
    float *attn_part;                  /* attention's split states (KV_CPU_ATTN_PART floats; NULL: one thread) */
    /* the first failure since the last status call (ops run on one caller
     * thread; workers report through their op, which records here) */
    int err_code;                      /* 0: none */
    char err_op[24];                   /* "matmul" */
    char err_msg[400];
    /* prepare_weight's panels, by the weight's data address: an open-
     * addressing table of cap (a power of two, 0: empty) slots */
    struct cpu_panels {
        const void *data;
        int64_t ne0, ne1;
        size_t nb1;
        uint8_t *buf;
    } *panels;
    size_t panels_cap, panels_n;
    atomic_ullong panels_bytes; /* of used: the panels' bytes */
} cpu_ctx;

static cpu_ctx *ctx_of(const kv_backend *b) { return (cpu_ctx *)b->ctx; }

/* ---- failures ------------------------------------------------------------ */

/* Records that op failed (the first failure since the last status call is
 * the one kept: later ones are usually its consequences). */
__attribute__((format(printf, 3, 4))) static void cpu_fail(cpu_ctx *c, const char *op, const char *fmt, ...) {
    if (c->err_code) return;
    c->err_code = KV_ERR_BACKEND;
    snprintf(c->err_op, sizeof c->err_op, "%s", op);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
}

static int cpu_status(kv_backend *b, kv_err *err) {
    cpu_ctx *c = ctx_of(b);
    if (!c->err_code) return 0;
    kv_err_set(err, KV_ERR_BACKEND, "%s: %s", c->err_op, c->err_msg);
    c->err_code = 0;
    c->err_op[0] = c->err_msg[0] = '\0';
    return KV_ERR_BACKEND;
}

/* ---- ISA ----------------------------------------------------------------- */

int kv_cpu_set_isa(kv_backend *b, kv_cpu_isa isa) {
    if (!b || !kv_cpu_isa_supported(isa)) return KV_ERR_UNSUPPORTED;
    ctx_of(b)->isa = isa;
    return KV_OK;
}

kv_cpu_isa kv_cpu_get_isa(const kv_backend *b) { return b ? ctx_of(b)->isa : KV_CPU_ISA_SCALAR; }

int kv_cpu_uses_amx(const kv_backend *b) { return kv_cpu_get_isa(b) == KV_CPU_ISA_AVX512 && kv_mm_amx_on(); }

/* ---- memory -------------------------------------------------------------- */

/* Buffers carry a 64-byte header holding their size, so free() can account
 * for it and the payload stays 64-byte aligned. */
#define HDR 64

static void *cpu_alloc(kv_backend *b, size_t bytes) {
    if (bytes > SIZE_MAX - 2 * HDR) return NULL;
    size_t total = (bytes + HDR + 63) & ~(size_t)63;
    uint8_t *p = aligned_alloc(64, total);
    if (!p) return NULL;
    memcpy(p, &total, sizeof total);
    atomic_fetch_add(&ctx_of(b)->used, total);
    return p + HDR;
}

static void cpu_free(kv_backend *b, void *ptr) {
    if (!ptr) return;
    uint8_t *p = (uint8_t *)ptr - HDR;
    size_t total;
    memcpy(&total, p, sizeof total);
    atomic_fetch_sub(&ctx_of(b)->used, total);
    free(p);
}

static void cpu_copy(kv_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void *kv_cpu_scratch(kv_backend *b, int ith, size_t bytes) {
    if (!b) return NULL;
    cpu_ctx *c = ctx_of(b);
    if (ith < 0 || ith >= c->n_threads || bytes > c->scratch_cap) return NULL;
    return c->scratch[ith];
}

void *kv_cpu_act_scratch(kv_backend *b, size_t bytes) {
    if (!b) return NULL;
    cpu_ctx *c = ctx_of(b);
    return bytes <= c->act_cap ? c->act : NULL;
}

/* The matmul weight types a reservation covers: every one the kernels
 * take when the caller did not say. */
static int reserve_covers(const kv_backend_limits *lim, int t) {
    if (lim->weight_types) return t < 64 && (lim->weight_types >> t & 1);
    kv_tensor probe = {.type = (kv_type)t, .ne0 = KV_QK_K, .ne1 = 1, .nb1 = kv_type_row_size((kv_type)t, KV_QK_K),
                       .data = &probe};
    return kv_type_get(t) && kv_mm_check(&probe, NULL) == KV_OK;
}

/* Sizes the matmul scratch for lim: per-thread panels for rows of max_k,
 * and the activation buffer for max_rows rows of the most demanding weight
 * type and ISA (the ISA may be changed later). New buffers are allocated
 * first and swapped in only when all of them could be had. */
static int cpu_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    cpu_ctx *c = ctx_of(b);
    /* rounded up to a K-quant super-block: a shorter row of such a type
     * must fit too, and the sizes only grow with K */
    const int64_t K = (lim->max_k + KV_QK_K - 1) / KV_QK_K * KV_QK_K;
    size_t scr = kv_mm_scratch_bytes(K), act = 0;
    for (int t = 0; t < KV_TYPE_COUNT; t++) {
        if (!reserve_covers(lim, t)) continue;
        for (int isa = 0; isa < KV_CPU_ISA_COUNT; isa++) {
            size_t need = kv_mm_act_bytes((kv_type)t, lim->max_rows, K, (kv_cpu_isa)isa);
            if (need > act) act = need;
        }
    }
    scr = (scr + 63) & ~(size_t)63; /* aligned_alloc wants a multiple of the alignment */
    act = (act + 63) & ~(size_t)63;
    void *ns[KV_CPU_MAX_THREADS] = {0}, *na = NULL;
    int grow_scr = scr > c->scratch_cap, grow_act = act > c->act_cap;
    for (int i = 0; grow_scr && i < c->n_threads; i++)
        if (!(ns[i] = aligned_alloc(64, scr))) goto nomem;
    /* act is one region; the buffer holds KV_MATMUL_MULTI_MAX of them, one
     * per activation format of a matmul_multi */
    if (grow_act && !(na = aligned_alloc(64, act * KV_MATMUL_MULTI_MAX))) goto nomem;
    if (grow_scr) {
        for (int i = 0; i < c->n_threads; i++) {
            free(c->scratch[i]);
            c->scratch[i] = ns[i];
        }
        atomic_fetch_add(&c->used, (uint64_t)(scr - c->scratch_cap) * (uint64_t)c->n_threads);
        c->scratch_cap = scr;
    }
    if (grow_act) {
        free(c->act);
        c->act = na;
        atomic_fetch_add(&c->used, (act - c->act_cap) * KV_MATMUL_MULTI_MAX);
        c->act_cap = act;
    }
    return KV_OK;
nomem:
    for (int i = 0; i < c->n_threads; i++) free(ns[i]);
    free(na);
    return kv_err_set(err, KV_ERR_NOMEM, "cpu backend: cannot reserve %zu bytes of scratch per thread and %zu shared",
                      scr, act);
}

kv_threadpool *kv_cpu_pool(kv_backend *b) { return b ? ctx_of(b)->pool : NULL; }

/* ---- prepare_weight: pre-packed panels ---------------------------------- */

static size_t panel_slot(const cpu_ctx *c, const void *data) {
    uintptr_t h = (uintptr_t)data;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 7) & (c->panels_cap - 1);
}

/* The panels made for w (the same data, shape and stride), or NULL. */
static const uint8_t *cpu_panels_of(const void *owner, const kv_tensor *w) {
    const cpu_ctx *c = owner;
    if (!c->panels_cap || !w->data) return NULL;
    for (size_t i = panel_slot(c, w->data);; i = (i + 1) & (c->panels_cap - 1)) {
        const struct cpu_panels *e = &c->panels[i];
        if (!e->data) return NULL;
        if (e->data == w->data)
            return e->ne0 == w->ne0 && e->ne1 == w->ne1 && e->nb1 == w->nb1 ? e->buf : NULL;
    }
}

static int panels_insert(cpu_ctx *c, const struct cpu_panels *n) {
    if (2 * (c->panels_n + 1) > c->panels_cap) { /* keep the load at most 1/2 */
        size_t cap = c->panels_cap ? 2 * c->panels_cap : 64;
        struct cpu_panels *t = calloc(cap, sizeof *t), *old = c->panels;
        if (!t) return KV_ERR_NOMEM;
        size_t oc = c->panels_cap;
        c->panels = t;
        c->panels_cap = cap;
        c->panels_n = 0;
        for (size_t i = 0; i < oc; i++)
            if (old[i].data) panels_insert(c, &old[i]);
        free(old);
    }
    size_t i = panel_slot(c, n->data);
    while (c->panels[i].data) i = (i + 1) & (c->panels_cap - 1);
    c->panels[i] = *n;
    c->panels_n++;
    return KV_OK;
}

static int cpu_prepare_weight(kv_backend *b, const kv_tensor *w, kv_err *err) {
    cpu_ctx *c = ctx_of(b);
    int rc = kv_mm_check(w, err);
    if (rc != KV_OK) return rc;
    /* AMX tiles read the rows in place (kv_mm_amx_rows): no panels there;
     * KVTOP_CPU_PANELS=0 turns them off (A/B runs: results do not change) */
    const char *env = getenv("KVTOP_CPU_PANELS");
    const size_t bytes = kv_mm_amx_on() || (env && !strcmp(env, "0")) ? 0 : kv_mm_panels_bytes(w, c->isa);
    if (!bytes || cpu_panels_of(c, w)) return KV_OK;
    /* NOTE: 4 KiB pages: marked for huge pages (MADV_HUGEPAGE) a 1.1 GB
     * weight set took 2.7 s instead of 1.0 s to fault in on a VM guest,
     * and decode ran no faster */
    struct cpu_panels e = {w->data, w->ne0, w->ne1, w->nb1, aligned_alloc(64, (bytes + 63) & ~(size_t)63)};
    if (!e.buf)
        return kv_err_set(err, KV_ERR_NOMEM, "cpu backend: no memory for the %zu-byte panels of a %lld x %lld %s weight",
                          bytes, (long long)w->ne1, (long long)w->ne0, kv_type_name((int)w->type));
    kv_mm_panels_pack(w, e.buf, c->pool);
    if (panels_insert(c, &e) != KV_OK) {
        free(e.buf);
        return kv_err_set(err, KV_ERR_NOMEM, "cpu backend: out of memory");
    }
    atomic_fetch_add(&c->used, (unsigned long long)bytes);
    atomic_fetch_add(&c->panels_bytes, (unsigned long long)bytes);
#ifdef MADV_PAGEOUT
    /* The row bytes are read again only by get_rows (a tied embedding) and
     * other ISAs: let the kernel reclaim their pages (content-preserving:
     * file pages drop and fault back in, anonymous ones go to swap or stay),
     * so the model is not resident twice. Advice only. */
    {
        const long psz = sysconf(_SC_PAGESIZE);
        const uintptr_t lo = ((uintptr_t)w->data + (uintptr_t)psz - 1) & ~(uintptr_t)(psz - 1);
        const uintptr_t hi = ((uintptr_t)w->data + kv_tensor_span(w)) & ~(uintptr_t)(psz - 1);
        if (psz > 0 && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_PAGEOUT);
    }
#endif
    return KV_OK;
}

static int cpu_upload_weight(kv_backend *b, kv_tensor *w, kv_err *err) {
    (void)b;
    /* Weights stay where they are (the file mapping); only check that the
     * kernels can read them. */
    return kv_mm_check(w, err);
}

static void cpu_mem_info(kv_backend *b, kv_backend_mem *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return;
    out->valid = 1;
    out->total_bytes = (uint64_t)pages * (uint64_t)psz;
    out->used_bytes = atomic_load(&ctx_of(b)->used);
    out->prepared_bytes = atomic_load(&ctx_of(b)->panels_bytes);
}

/* ---- parallel helper for element-wise ops ------------------------------- */

typedef void (*range_fn)(void *arg, int64_t i0, int64_t i1);
typedef struct range_task {
    range_fn fn;
    void *arg;
    int64_t count;
    int64_t align; /* split points are multiples of this */
} range_task;

static void range_run(void *ctx, int ith, int nth) {
    range_task *t = ctx;
    int64_t units = (t->count + t->align - 1) / t->align;
    int64_t u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    int64_t i0 = KV_MIN(u0 * t->align, t->count), i1 = KV_MIN(u1 * t->align, t->count);
    if (i1 > i0) t->fn(t->arg, i0, i1);
}

/* Runs fn over [0, count) split across the pool when the work is big
 * (`weight` elements in total), else on the calling thread. */
static void par_for(kv_backend *b, range_fn fn, void *arg, int64_t count, int64_t align, int64_t weight) {
    if (count <= 0) return;
    kv_threadpool *p = ctx_of(b)->pool;
    if (weight < KV_CPU_MIN_PAR_ELEMS || kv_threadpool_size(p) == 1 || count < 2) {
        fn(arg, 0, count);
        return;
    }
    range_task t = {fn, arg, count, align};
    kv_threadpool_run(p, range_run, &t);
}

/* ---- get_rows ------------------------------------------------------------ */

typedef struct rows_arg {
    const kv_tensor *w;
    const int32_t *ids;
    float *out;
    atomic_int bad; /* rows that got NaN; the op records a failure */
    atomic_int bad_id; /* one of their ids */
} rows_arg;

static void get_rows_range(void *arg, int64_t i0, int64_t i1) {
    rows_arg *a = arg;
    const kv_tensor *w = a->w;
    for (int64_t i = i0; i < i1; i++) {
        float *o = a->out + i * w->ne0;
        int32_t id = a->ids[i];
        /* NOTE: an out-of-range id is a caller bug (the engine validates
         * token ids); give a row of NaN rather than read out of bounds. */
        if (id < 0 || id >= w->ne1 || kv_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)id * w->nb1, o,
                                                        w->ne0) != 0) {
            for (int64_t k = 0; k < w->ne0; k++) o[k] = NAN;
            atomic_fetch_add_explicit(&a->bad, 1, memory_order_relaxed);
            atomic_store_explicit(&a->bad_id, id, memory_order_relaxed);
        }
    }
}

static void cpu_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    if (!w || !ids || !out || n <= 0) return;
    kv_err e;
    if (kv_mm_check(w, &e) != KV_OK) {
        cpu_fail(ctx_of(b), "get_rows", "%s", e.msg);
        return;
    }
    rows_arg a = {.w = w, .ids = ids, .out = out};
    atomic_init(&a.bad, 0);
    atomic_init(&a.bad_id, 0);
    par_for(b, get_rows_range, &a, n, 1, (int64_t)n * w->ne0);
    int bad = atomic_load(&a.bad);
    if (bad)
        cpu_fail(ctx_of(b), "get_rows", "%d of %d rows could not be read (id %d of %lld rows)", bad, n,
                 atomic_load(&a.bad_id), (long long)w->ne1);
}

/* ---- rmsnorm ------------------------------------------------------------- */

typedef struct norm_arg {
    const float *x;
    const float *weight;
    float *out;
    int dim;
    float eps;
    kv_cpu_isa isa;
} norm_arg;

static float sumsq_scalar(const float *x, int dim) {
    double s = 0.0;
    for (int i = 0; i < dim; i++) s += (double)x[i] * x[i];
    return (float)s;
}

static void rmsnorm_range(void *arg, int64_t i0, int64_t i1) {
    norm_arg *a = arg;
    for (int64_t i = i0; i < i1; i++) {
        const float *x = a->x + i * a->dim;
        float *o = a->out + i * a->dim;
        float ss;
#ifdef KV_HAVE_X86_KERNELS
        ss = a->isa >= KV_CPU_ISA_AVX2 ? kv_cpu_sumsq_avx2(x, a->dim) : sumsq_scalar(x, a->dim);
#else
        ss = sumsq_scalar(x, a->dim);
#endif
        float scale = 1.0f / sqrtf(ss / (float)a->dim + a->eps);
        for (int k = 0; k < a->dim; k++) o[k] = x[k] * scale * a->weight[k];
    }
}

static void cpu_rmsnorm(kv_backend *b, const float *x, const float *weight, float *out, int n, int dim, float eps) {
    if (!x || !weight || !out || n <= 0 || dim <= 0) return;
    norm_arg a = {x, weight, out, dim, eps, ctx_of(b)->isa};
    par_for(b, rmsnorm_range, &a, n, 1, (int64_t)n * dim);
}

/* ---- rope ---------------------------------------------------------------- */

typedef struct rope_arg {
    float *x;
    const int32_t *pos;
    int n_heads, head_dim, rot_dim, neox;
    float base;
    float freq_scale;          /* 1: none (linear position scaling) */
    const float *freq_factors; /* (rot_dim / 2) angle divisors, or NULL */
} rope_arg;

static void rope_range(void *arg, int64_t i0, int64_t i1) {
    rope_arg *a = arg;
    int half = a->rot_dim / 2;
    float inv_freq[KV_ROPE_MAX_PAIRS], cs[KV_ROPE_MAX_PAIRS], sn[KV_ROPE_MAX_PAIRS];
    for (int i = 0; i < half; i++) {
        inv_freq[i] = powf(a->base, -(float)(2 * i) / (float)a->rot_dim);
        if (a->freq_factors) inv_freq[i] /= a->freq_factors[i];
        if (a->freq_scale != 1.0f) inv_freq[i] *= a->freq_scale;
    }
    for (int64_t t = i0; t < i1; t++) {
        float p = (float)a->pos[t];
        for (int i = 0; i < half; i++) {
            float th = p * inv_freq[i];
            cs[i] = cosf(th);
            sn[i] = sinf(th);
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *v = a->x + (t * a->n_heads + h) * a->head_dim;
            if (a->neox) {
                for (int i = 0; i < half; i++) {
                    float x0 = v[i], x1 = v[i + half];
                    v[i] = x0 * cs[i] - x1 * sn[i];
                    v[i + half] = x0 * sn[i] + x1 * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = v[2 * i], x1 = v[2 * i + 1];
                    v[2 * i] = x0 * cs[i] - x1 * sn[i];
                    v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                }
            }
        }
    }
}

static void cpu_rope_ext(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                         int rot_dim, float base, int neox, float freq_scale, const float *freq_factors) {
    /* Bad shapes are caller bugs; leave x unchanged and say so. */
    if (!x || !pos || n <= 0) return;
    if (n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 ||
        rot_dim / 2 > KV_ROPE_MAX_PAIRS || !(base > 0.0f)) {
        cpu_fail(ctx_of(b), "rope", "unsupported shape: %d heads of %d, %d rotated, base %g", n_heads, head_dim,
                 rot_dim, (double)base);
        return;
    }
    if (!(freq_scale > 0.0f)) {
        cpu_fail(ctx_of(b), "rope", "frequency scale %g is not positive", (double)freq_scale);
        return;
    }
    rope_arg a = {x, pos, n_heads, head_dim, rot_dim, neox != 0, base, freq_scale, freq_factors};
    par_for(b, rope_range, &a, n, 1, (int64_t)n * n_heads * rot_dim * 8);
}

static void cpu_rope(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                     float base, int neox) {
    cpu_rope_ext(b, x, pos, n, n_heads, head_dim, rot_dim, base, neox, 1.0f, NULL);
}

/* ---- silu_mul, add ------------------------------------------------------- */

typedef struct ew_arg {
    float *x;
    const float *y;
    kv_cpu_isa isa;
} ew_arg;

static void silu_mul_scalar(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void silu_range(void *arg, int64_t i0, int64_t i1) {
    ew_arg *a = arg;
#ifdef KV_HAVE_X86_KERNELS
    if (a->isa >= KV_CPU_ISA_AVX2) i0 += kv_cpu_silu_mul_avx2(a->x + i0, a->y + i0, i1 - i0);
#endif
    silu_mul_scalar(a->x + i0, a->y + i0, i1 - i0);
}

static void cpu_silu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    if (!gate || !up || count <= 0) return;
    ew_arg a = {gate, up, ctx_of(b)->isa};
    par_for(b, silu_range, &a, count, 64, count * 8);
}

static void add_range(void *arg, int64_t i0, int64_t i1) {
    ew_arg *a = arg;
    for (int64_t i = i0; i < i1; i++) a->x[i] += a->y[i];
}

static void cpu_add(kv_backend *b, float *x, const float *y, int64_t count) {
    if (!x || !y || count <= 0) return;
    ew_arg a = {x, y, ctx_of(b)->isa};
    par_for(b, add_range, &a, count, 64, count);
}

/* ---- gelu_mul, scale, add_rows: the ops of the architectures past llama - */

/* NOTE: 0.5 (1 + tanh(y)) is computed as 1 / (1 + exp(-2y)), the same
 * value without the cancellation of 1 + tanh(y) for negative y. */
void kv_gelu_mul_ref(float *g, const float *u, int64_t n) {
    const float c2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = x / (1.0f + expf(-c2 * x * (1.0f + 0.044715f * x * x))) * u[i];
    }
}

static void gelu_range(void *arg, int64_t i0, int64_t i1) {
    ew_arg *a = arg;
#ifdef KV_HAVE_X86_KERNELS
    if (a->isa >= KV_CPU_ISA_AVX2) {
        kv_cpu_gelu_mul_avx2(a->x + i0, a->y + i0, i1 - i0);
        return;
    }
#endif
    kv_gelu_mul_ref(a->x + i0, a->y + i0, i1 - i0);
}

static void cpu_gelu_mul(kv_backend *b, float *gate, const float *up, int64_t count) {
    if (!gate || !up || count <= 0) return;
    ew_arg a = {gate, up, ctx_of(b)->isa};
    par_for(b, gelu_range, &a, count, 64, count * 8);
}

/* ---- logits_scan: argmax and finiteness of logit rows --------------- */

int32_t kv_logits_scan_row_ref(const float *x, int n, uint8_t *finite) {
    int32_t at = 0;
    float best = x[0];
    *finite = (uint8_t)!kv_logits_scan_steps(x, 0, n, &best, &at);
    return at;
}

typedef struct scan_arg {
    const float *x;
    int dim;
    int32_t *ids;
    uint8_t *finite;
    kv_cpu_isa isa;
} scan_arg;

static void scan_range(void *arg, int64_t r0, int64_t r1) {
    const scan_arg *a = arg;
    for (int64_t r = r0; r < r1; r++) {
        const float *row = a->x + (size_t)r * (size_t)a->dim;
#ifdef KV_HAVE_X86_KERNELS
        if (a->isa >= KV_CPU_ISA_AVX2) {
            a->ids[r] = kv_cpu_logits_scan_row_avx2(row, a->dim, a->finite + r);
            continue;
        }
#endif
        a->ids[r] = kv_logits_scan_row_ref(row, a->dim, a->finite + r);
    }
}

static void cpu_logits_scan(kv_backend *b, const float *x, int n, int dim, int32_t *ids, uint8_t *finite) {
    if (!x || n <= 0 || dim <= 0 || !ids || !finite) return;
    scan_arg a = {x, dim, ids, finite, ctx_of(b)->isa};
    par_for(b, scan_range, &a, n, 1, (int64_t)n * dim);
}

typedef struct scale_arg {
    float *x;
    float s;
} scale_arg;

static void scale_range(void *arg, int64_t i0, int64_t i1) {
    scale_arg *a = arg;
    for (int64_t i = i0; i < i1; i++) a->x[i] *= a->s;
}

static void cpu_scale(kv_backend *b, float *x, float s, int64_t count) {
    if (!x || count <= 0) return;
    scale_arg a = {x, s};
    par_for(b, scale_range, &a, count, 64, count);
}

typedef struct bias_arg {
    float *x;
    const float *bias;
    int dim;
} bias_arg;

static void bias_range(void *arg, int64_t i0, int64_t i1) {
    bias_arg *a = arg;
    for (int64_t i = i0; i < i1; i++) {
        float *r = a->x + i * a->dim;
        for (int k = 0; k < a->dim; k++) r[k] += a->bias[k];
    }
}

static void cpu_add_rows(kv_backend *b, float *x, const float *bias, int n, int dim) {
    if (!x || !bias || n <= 0 || dim <= 0) return;
    bias_arg a = {x, bias, dim};
    par_for(b, bias_range, &a, n, 1, (int64_t)n * dim);
}

/* ---- matmul and the KV-cache ops: the kernels with this backend's state - */

/* What the matmul driver may use for one call: the pool, the per-thread
 * scratch, the activation regions (KV_MATMUL_MULTI_MAX of act_cap) and the
 * panels. */
static kv_mm_env cpu_mm_env(cpu_ctx *c) {
    return (kv_mm_env){c->pool, c->scratch, c->scratch_cap, c->act, c->act_cap, KV_MATMUL_MULTI_MAX, cpu_panels_of, c};
}

void kv_cpu_matmul_isa(kv_backend *b, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n) {
    if (!b || !w || !x || !y || n <= 0) return;
    cpu_ctx *c = ctx_of(b);
    const kv_mm_env env = cpu_mm_env(c);
    kv_err e;
    if (kv_mm_run(&env, isa, w, x, y, n, &e) != KV_OK) cpu_fail(c, "matmul", "%s", e.msg);
}

void kv_cpu_matmul(kv_backend *b, const kv_tensor *w, const float *x, float *y, int n) {
    kv_cpu_matmul_isa(b, kv_cpu_get_isa(b), w, x, y, n);
}

void kv_cpu_matmul_multi_isa(kv_backend *b, kv_cpu_isa isa, const kv_tensor *const *w, int nw, const float *x,
                             float *const *y, int n) {
    if (!b || !w || !x || !y || n <= 0) return;
    cpu_ctx *c = ctx_of(b);
    const kv_mm_env env = cpu_mm_env(c);
    kv_err e;
    if (kv_mm_run_multi(&env, isa, w, nw, x, y, n, &e) != KV_OK) cpu_fail(c, "matmul_multi", "%s", e.msg);
}

static void cpu_matmul_multi(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y,
                             int n) {
    kv_cpu_matmul_multi_isa(b, kv_cpu_get_isa(b), w, nw, x, y, n);
}

void kv_cpu_matmul_groups_isa(kv_backend *b, kv_cpu_isa isa, const kv_matmul_group *g, int ng) {
    if (!b || !g || ng <= 0) return;
    cpu_ctx *c = ctx_of(b);
    const kv_mm_env env = cpu_mm_env(c);
    kv_err e;
    if (kv_mm_run_groups(&env, isa, g, ng, &e) != KV_OK) cpu_fail(c, "matmul_groups", "%s", e.msg);
}

static void cpu_matmul_groups(kv_backend *b, const kv_matmul_group *g, int ng) {
    kv_cpu_matmul_groups_isa(b, kv_cpu_get_isa(b), g, ng);
}

static void cpu_attention_window(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                                 const float *q, float *out, int n_heads, float scale, int window) {
    if (!kv || !ab || ab->n_tokens <= 0) return;
    if (n_heads <= 0 || kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads || kv->head_dim <= 0 ||
        kv->head_dim > KV_ATTN_MAX_HEAD_DIM || layer < 0 || layer >= kv->n_layers) {
        cpu_fail(ctx_of(b), "attention", "unsupported shape: %d query heads over %d kv heads of %d, layer %d of %d",
                 n_heads, kv->n_kv_heads, kv->head_dim, layer, kv->n_layers);
        return;
    }
    cpu_ctx *c = ctx_of(b);
    kv_attn_run_split(c->pool, c->isa, kv, layer, ab, q, out, n_heads, scale, window, c->attn_part,
                      c->attn_part ? KV_CPU_ATTN_PART : 0);
}

void kv_cpu_attention(kv_backend *b, const kv_pages *kv, int layer, const kv_attn_batch *ab, const float *q,
                      float *out, int n_heads, float scale) {
    cpu_attention_window(b, kv, layer, ab, q, out, n_heads, scale, 0);
}

void kv_cpu_kv_store(kv_backend *b, kv_pages *kv, int layer, const kv_attn_batch *ab, const float *k,
                     const float *v) {
    if (kv && ab && ab->n_tokens > 0 && (layer < 0 || layer >= kv->n_layers)) {
        cpu_fail(ctx_of(b), "kv_store", "layer %d of %d", layer, kv->n_layers);
        return;
    }
    kv_attn_store(kv_cpu_pool(b), kv_cpu_get_isa(b), kv, layer, ab, k, v);
}

void kv_cpu_copy_block(kv_backend *b, kv_pages *kv, int dst, int src) {
    (void)b;
    kv_attn_copy_block(kv, dst, src);
}

/* ---- lifecycle ----------------------------------------------------------- */

static void cpu_destroy(kv_backend *b) {
    if (!b) return;
    cpu_ctx *c = ctx_of(b);
    if (c) {
        kv_threadpool_free(c->pool);
        for (int i = 0; i < KV_CPU_MAX_THREADS; i++) free(c->scratch[i]);
        free(c->act);
        free(c->attn_part);
        for (size_t i = 0; i < c->panels_cap; i++) free(c->panels[i].buf);
        free(c->panels);
        free(c);
    }
    free(b);
}

static const kv_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .upload_weight = cpu_upload_weight,
    .matmul = kv_cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .matmul_groups = cpu_matmul_groups,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .kv_store = kv_cpu_kv_store,
    .attention = kv_cpu_attention,
    .copy_block = kv_cpu_copy_block,
    .mem_info = cpu_mem_info,
    .destroy = cpu_destroy,
    .gelu_mul = cpu_gelu_mul,
    .scale = cpu_scale,
    .add_rows = cpu_add_rows,
    .rope_ext = cpu_rope_ext,
    .attention_window = cpu_attention_window,
    .moe_route = kv_cpu_moe_route,
    .scatter_add = kv_cpu_scatter_add,
    .status = cpu_status,
    .reserve = cpu_reserve,
    .clock = NULL, /* host time */
    .prepare_weight = cpu_prepare_weight,
    .host_buffers = 1,
    .logits_scan = cpu_logits_scan,
};

kv_backend *kv_cpu_backend_create(int n_threads, kv_err *err) {
    if (n_threads > KV_CPU_MAX_THREADS) {
        kv_err_set(err, KV_ERR_INVAL, "cpu backend: %d threads requested, at most %d", n_threads,
                   KV_CPU_MAX_THREADS);
        return NULL;
    }
    kv_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) goto nomem;
    b->ops = &cpu_ops;
    b->ctx = c;
    atomic_init(&c->used, 0);
    kv_qext_init(); /* pick quant_ext's dot-product ISA before any matmul */
    c->isa = kv_cpu_isa_best();
    const char *env = getenv("KVTOP_CPU_ISA");
    kv_cpu_isa want;
    if (env && *env) {
        if (kv_cpu_isa_from_name(env, &want) != 0) {
            kv_err_set(err, KV_ERR_INVAL, "KVTOP_CPU_ISA=%s: expected scalar, avx2 or avx512", env);
            goto fail;
        }
        if (want < c->isa) c->isa = want; /* a cap: never above what the CPU has */
    }
    c->pool = kv_threadpool_new(n_threads);
    if (!c->pool) {
        kv_err_set(err, KV_ERR_BACKEND, "cpu backend: cannot start %d threads", n_threads);
        goto fail;
    }
    c->n_threads = kv_threadpool_size(c->pool);
    if (c->n_threads > KV_CPU_MAX_THREADS) {
        kv_err_set(err, KV_ERR_INVAL, "cpu backend: %d threads, at most %d", c->n_threads, KV_CPU_MAX_THREADS);
        goto fail;
    }
    if (c->n_threads > 1) {
        if (!(c->attn_part = aligned_alloc(64, KV_CPU_ATTN_PART * sizeof(float)))) goto nomem;
        atomic_fetch_add(&c->used, KV_CPU_ATTN_PART * sizeof(float));
    }
    b->n_threads = c->n_threads;
    return b;
nomem:
    kv_err_set(err, KV_ERR_NOMEM, "cpu backend: out of memory");
fail:
    if (b && c) {
        cpu_destroy(b);
    } else {
        free(b);
        free(c);
    }
    return NULL;
}
