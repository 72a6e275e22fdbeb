/* cpu.c - the "cpu" backend table: host buffers, per-thread scratch, ISA
 * selection, and the element-wise ops (get_rows, rmsnorm, rope, silu_mul,
 * add). The matmul lives in matmul*.c, the KV-cache ops in cpu_attention.c.
 * Every op keeps a scalar path; silu_mul and rmsnorm have AVX2 / AVX-512
 * variants chosen with the backend's ISA. */
#include "cpu.h"
#include "quant_ext.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KV_HAVE_X86_KERNELS
#include <cpuid.h>
#include <immintrin.h>
#endif

/* Element-wise ops go parallel above this many elements. */
#define KV_CPU_MIN_PAR_ELEMS (1 << 16)
#define KV_ROPE_MAX_PAIRS 1024

typedef struct cpu_ctx {
    kv_threadpool *pool;
    int n_threads;
    kv_cpu_isa isa;
    void *scratch[KV_CPU_MAX_THREADS];     /* per-thread scratch */
    size_t scratch_cap[KV_CPU_MAX_THREADS]; /* bytes */
    void *act;                               /* shared activation scratch */
    size_t act_cap;                          /* bytes */
    atomic_ullong used;                      /* bytes held by alloc() and scratch */
} cpu_ctx;

static cpu_ctx *ctx_of(const kv_backend *b) { return (cpu_ctx *)b->ctx; }

/* ---- ISA ----------------------------------------------------------------- */

/* Probes the CPU once: cpuid traps to the hypervisor in a VM (tens of
 * microseconds), and ops ask for every call. */
static int isa_ok[KV_CPU_ISA_COUNT]; /* written once under isa_once */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_probe(void) {
    isa_ok[KV_CPU_ISA_SCALAR] = 1;
#ifdef KV_HAVE_X86_KERNELS
    unsigned a, b, c, d;
    __builtin_cpu_init();
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    isa_ok[KV_CPU_ISA_AVX2] = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    isa_ok[KV_CPU_ISA_AVX512] = isa_ok[KV_CPU_ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#endif
}

int kv_cpu_isa_supported(kv_cpu_isa isa) {
    if ((int)isa < 0 || isa >= KV_CPU_ISA_COUNT) return 0;
    pthread_once(&isa_once, isa_probe);
    return isa_ok[isa];
}

kv_cpu_isa kv_cpu_isa_best(void) {
    for (int i = KV_CPU_ISA_COUNT - 1; i > 0; i--)
        if (kv_cpu_isa_supported((kv_cpu_isa)i)) return (kv_cpu_isa)i;
    return KV_CPU_ISA_SCALAR;
}

static const char *const isa_names[KV_CPU_ISA_COUNT] = {"scalar", "avx2", "avx512"};

const char *kv_cpu_isa_name(kv_cpu_isa isa) {
    return (int)isa >= 0 && isa < KV_CPU_ISA_COUNT ? isa_names[isa] : "unknown";
}

int kv_cpu_isa_from_name(const char *name, kv_cpu_isa *out) {
    for (int i = 0; name && i < KV_CPU_ISA_COUNT; i++)
        if (!strcmp(name, isa_names[i])) {
            *out = (kv_cpu_isa)i;
            return 0;
        }
    return -1;
}

int kv_cpu_set_isa(kv_backend *b, kv_cpu_isa isa) {
    if (!b || !kv_cpu_isa_supported(isa)) return KV_ERR_UNSUPPORTED;
    ctx_of(b)->isa = isa;
    return KV_OK;
}

kv_cpu_isa kv_cpu_get_isa(const kv_backend *b) { return b ? ctx_of(b)->isa : KV_CPU_ISA_SCALAR; }

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

static void *grow(void **slot, size_t *cap, size_t bytes, atomic_ullong *used) {
    if (bytes <= *cap && *slot) return *slot;
    size_t nc = (bytes + 4095) & ~(size_t)4095;
    if (nc < bytes) return NULL;
    void *p = aligned_alloc(64, nc);
    if (!p) return NULL;
    free(*slot);
    atomic_fetch_sub(used, *cap);
    atomic_fetch_add(used, nc);
    *slot = p;
    *cap = nc;
    return p;
}

void *kv_cpu_scratch(kv_backend *b, int ith, size_t bytes) {
    if (!b) return NULL;
    cpu_ctx *c = ctx_of(b);
    if (ith < 0 || ith >= c->n_threads) return NULL;
    return grow(&c->scratch[ith], &c->scratch_cap[ith], bytes, &c->used);
}

void *kv_cpu_act_scratch(kv_backend *b, size_t bytes) {
    if (!b) return NULL;
    cpu_ctx *c = ctx_of(b);
    return grow(&c->act, &c->act_cap, bytes, &c->used);
}

kv_threadpool *kv_cpu_pool(kv_backend *b) { return b ? ctx_of(b)->pool : NULL; }

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
        }
    }
}

static void cpu_get_rows(kv_backend *b, const kv_tensor *w, const int32_t *ids, float *out, int n) {
    if (!w || !ids || !out || n <= 0 || kv_mm_check(w, NULL) != KV_OK) return;
    rows_arg a = {w, ids, out};
    par_for(b, get_rows_range, &a, n, 1, (int64_t)n * w->ne0);
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

#ifdef KV_HAVE_X86_KERNELS
__attribute__((target("avx2,fma"))) static float sumsq_avx2(const float *x, int dim) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= dim; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; i < dim; i++) s += x[i] * x[i];
    return s;
}
#endif

static void rmsnorm_range(void *arg, int64_t i0, int64_t i1) {
    norm_arg *a = arg;
    for (int64_t i = i0; i < i1; i++) {
        const float *x = a->x + i * a->dim;
        float *o = a->out + i * a->dim;
        float ss;
#ifdef KV_HAVE_X86_KERNELS
        ss = a->isa >= KV_CPU_ISA_AVX2 ? sumsq_avx2(x, a->dim) : sumsq_scalar(x, a->dim);
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
} rope_arg;

static void rope_range(void *arg, int64_t i0, int64_t i1) {
    rope_arg *a = arg;
    int half = a->rot_dim / 2;
    float inv_freq[KV_ROPE_MAX_PAIRS], cs[KV_ROPE_MAX_PAIRS], sn[KV_ROPE_MAX_PAIRS];
    for (int i = 0; i < half; i++) inv_freq[i] = powf(a->base, -(float)(2 * i) / (float)a->rot_dim);
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

static void cpu_rope(kv_backend *b, float *x, const int32_t *pos, int n, int n_heads, int head_dim, int rot_dim,
                     float base, int neox) {
    /* Bad shapes are caller bugs; leave x unchanged. */
    if (!x || !pos || n <= 0 || n_heads <= 0 || head_dim <= 0 || rot_dim <= 0 || rot_dim > head_dim ||
        rot_dim % 2 || rot_dim / 2 > KV_ROPE_MAX_PAIRS || !(base > 0.0f))
        return;
    rope_arg a = {x, pos, n_heads, head_dim, rot_dim, neox != 0, base};
    par_for(b, rope_range, &a, n, 1, (int64_t)n * n_heads * rot_dim * 8);
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

#ifdef KV_HAVE_X86_KERNELS
/* exp(x) for x in [-87.3, 88.7] (clamped), Cody-Waite reduction and a
 * degree-6 polynomial: within 2 ulp of expf. */
__attribute__((target("avx2,fma"))) static inline __m256 exp_avx2(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) static void silu_mul_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    silu_mul_scalar(g + i, u + i, n - i);
}
#endif

static void silu_range(void *arg, int64_t i0, int64_t i1) {
    ew_arg *a = arg;
#ifdef KV_HAVE_X86_KERNELS
    if (a->isa >= KV_CPU_ISA_AVX2) {
        silu_mul_avx2(a->x + i0, a->y + i0, i1 - i0);
        return;
    }
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

/* ---- lifecycle ----------------------------------------------------------- */

static void cpu_destroy(kv_backend *b) {
    if (!b) return;
    cpu_ctx *c = ctx_of(b);
    if (c) {
        kv_threadpool_free(c->pool);
        for (int i = 0; i < KV_CPU_MAX_THREADS; i++) free(c->scratch[i]);
        free(c->act);
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
