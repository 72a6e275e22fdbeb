/* matmul.c - the CPU matmul driver and its scalar reference.
 * kv_mm_run quantizes the activations once per call (quantized weights),
 * then splits the weight rows over the pool's threads; each thread runs the
 * selected ISA's row kernel, which reads each weight row block once for all
 * n activation rows. The scalar kernels here are the oracle of the tests and
 * the fallback on CPUs without AVX2. */
#include "matmul.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "quant_ext.h"

/* Below this many multiply-adds a matmul runs on the calling thread alone:
 * waking the workers would cost more than the work (a 64x64 matvec of a tiny
 * model takes about a microsecond). */
#define KV_MM_MIN_PAR_MACS (1 << 16)
/* Activation quantization goes parallel above this many elements. */
#define KV_MM_MIN_PAR_QUANT (1 << 15)

static int is_quant(kv_type t) { return t == KV_TYPE_Q8_0 || t == KV_TYPE_Q4_0 || t == KV_TYPE_Q4_1; }

int kv_mm_zero_point(kv_type t) {
    switch (t) {
    case KV_TYPE_Q8_0:
        return 128;
    case KV_TYPE_Q4_0:
        return 8;
    default:
        return 0;
    }
}

size_t kv_mm_scratch_bytes(int64_t K) {
    size_t nbp = (size_t)(K / KV_QK + 16);
    /* float panel (16 x K floats) + its staging, or int8 panel + scales,
     * or the direct tiles' scale arrays; generous slack for alignment. */
    return (size_t)KV_MM_PANEL * (size_t)K * sizeof(float) * 2 + nbp * 64 * sizeof(float) + 16384;
}

/* ---- scalar reference ---------------------------------------------------- */

void kv_q8a_row_ref(const float *x, int64_t K, size_t bstride, int8_t *qs, float *d, int32_t *ioff, float *ds,
                    int zp) {
    for (int64_t b = 0; b < K / KV_QK; b++) {
        size_t o = (size_t)b * bstride;
        const float *xb = x + b * KV_QK;
        float amax = 0.0f;
        int bad = 0;
        for (int i = 0; i < KV_QK; i++) {
            float v = fabsf(xb[i]);
            if (v > amax) amax = v;
            if (xb[i] != xb[i]) bad = 1;
        }
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        int sum = 0;
        for (int i = 0; i < KV_QK; i++) {
            float v = xb[i] * id;
            /* lrintf: round half to even, as the SIMD converts do */
            int q = (v >= -127.5f && v <= 127.5f) ? (int)lrintf(v) : 0;
            qs[o * KV_QK + i] = (int8_t)q;
            sum += q;
        }
        kv_q8a_put(d, ioff, ds, o, db, sum, bad || isinf(amax), zp);
    }
}

static size_t blk_bytes(kv_type t) { return kv_type_get(t)->type_size; }

/* One weight row against one quantized activation row. */
static float dot_q_ref(kv_type t, const uint8_t *w, const kv_q8a *a, int n, int j, int64_t nb) {
    size_t bs = blk_bytes(t);
    double s = 0.0;
    for (int64_t b = 0; b < nb; b++, w += bs) {
        size_t o = (size_t)b * (size_t)n + (size_t)j; /* block-major */
        const int8_t *aq = a->qs + o * KV_QK;
        float da = a->d[o], dsa = a->ds[o];
        float dw = kv_fp16_to_fp32(kv_mm_rd16(w));
        int isum = 0;
        if (t == KV_TYPE_Q8_0) {
            const int8_t *q = (const int8_t *)(w + 2);
            for (int i = 0; i < KV_QK; i++) isum += q[i] * aq[i];
            s += (double)((float)isum * (dw * da));
        } else if (t == KV_TYPE_Q4_0) {
            const uint8_t *q = w + 2;
            for (int i = 0; i < KV_QK / 2; i++) {
                isum += ((q[i] & 0x0F) - 8) * aq[i];
                isum += ((q[i] >> 4) - 8) * aq[i + KV_QK / 2];
            }
            s += (double)((float)isum * (dw * da));
        } else { /* q4_1 */
            float mw = kv_fp16_to_fp32(kv_mm_rd16(w + 2));
            const uint8_t *q = w + 4;
            for (int i = 0; i < KV_QK / 2; i++) {
                isum += (q[i] & 0x0F) * aq[i];
                isum += (q[i] >> 4) * aq[i + KV_QK / 2];
            }
            s += (double)((float)isum * (dw * da)) + (double)(mw * dsa);
        }
    }
    return (float)s;
}

static float dot_f_ref(kv_type t, const uint8_t *w, const float *x, int64_t K) {
    double s = 0.0;
    if (t == KV_TYPE_F32) {
        for (int64_t k = 0; k < K; k++) {
            float v;
            memcpy(&v, w + 4 * k, 4); /* rows need not be 4-byte aligned */
            s += (double)v * x[k];
        }
    } else if (t == KV_TYPE_F16) {
        for (int64_t k = 0; k < K; k++) s += (double)kv_fp16_to_fp32(kv_mm_rd16(w + 2 * k)) * x[k];
    } else {
        for (int64_t k = 0; k < K; k++) s += (double)kv_bf16_to_fp32(kv_mm_rd16(w + 2 * k)) * x[k];
    }
    return (float)s;
}

void kv_mm_rows_ref(const kv_mm_args *a, int64_t r0, int64_t r1, void *scratch) {
    (void)scratch;
    int64_t nb = a->K / KV_QK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *w = a->w + (size_t)r * a->nb1;
        for (int j = 0; j < a->n; j++) {
            a->y[(size_t)j * a->M + r] = is_quant(a->type) ? dot_q_ref(a->type, w, &a->a, a->n, j, nb)
                                                           : dot_f_ref(a->type, w, a->x + (size_t)j * a->K, a->K);
        }
    }
}

/* ---- ISA table ----------------------------------------------------------- */

static const kv_mm_isa_kernels *isa_kernels(kv_cpu_isa isa) {
    static const kv_mm_isa_kernels tab[KV_CPU_ISA_COUNT] = {
        [KV_CPU_ISA_SCALAR] = {kv_mm_rows_ref, kv_q8a_row_ref, NULL},
#ifdef KV_HAVE_X86_KERNELS
        [KV_CPU_ISA_AVX2] = {kv_mm_rows_avx2, kv_q8a_row_avx2, kv_mm_xpack_avx2},
        [KV_CPU_ISA_AVX512] = {kv_mm_rows_avx512, kv_q8a_row_avx512, kv_mm_xpack_avx512},
#endif
    };
    if ((int)isa < 0 || isa >= KV_CPU_ISA_COUNT || !tab[isa].rows) return &tab[KV_CPU_ISA_SCALAR];
    return &tab[isa];
}

/* ---- threading ----------------------------------------------------------- */

typedef struct mm_task {
    kv_mm_args args;
    kv_mm_rows_fn rows;
    kv_q8a_row_fn quant;
    kv_mm_xpack_fn xpack;
    float *xp; /* the packed x being written (args.xp aliases it) */
    int zp;
    void *const *scratch; /* (nth) per-thread scratch */
    int64_t chunk;        /* rows per grab */
    atomic_llong next;    /* next unclaimed row */
} mm_task;

static void quant_rows(mm_task *t, int j0, int j1) {
    const kv_mm_args *a = &t->args;
    int64_t nb = a->K / KV_QK;
    (void)nb;
    for (int j = j0; j < j1; j++)
        t->quant(a->x + (size_t)j * a->K, a->K, (size_t)a->n, a->a.qs + (size_t)j * KV_QK, a->a.d + j,
                 a->a.ioff + j, a->a.ds + j, t->zp);
}

/* Prepares the activations: quantized (quantized weights) or packed (float
 * panels), rows [j0, j1) or groups of rows. */
static void prep_task(void *ctx, int ith, int nth) {
    mm_task *t = ctx;
    if (t->xp) {
        int groups = (t->args.n + KV_MM_XGROUP - 1) / KV_MM_XGROUP;
        int g0 = (int)((int64_t)groups * ith / nth), g1 = (int)((int64_t)groups * (ith + 1) / nth);
        for (int g = g0; g < g1; g++)
            t->xpack(t->args.x + (size_t)g * KV_MM_XGROUP * (size_t)t->args.K,
                     KV_MIN(t->args.n - g * KV_MM_XGROUP, KV_MM_XGROUP), t->args.K,
                     t->xp + (size_t)g * (size_t)t->args.K * KV_MM_XGROUP);
    } else {
        int n = t->args.n;
        quant_rows(t, (int)((int64_t)n * ith / nth), (int)((int64_t)n * (ith + 1) / nth));
    }
}

static void rows_task(void *ctx, int ith, int nth) {
    (void)nth;
    mm_task *t = ctx;
    int64_t M = t->args.M;
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&t->next, t->chunk, memory_order_relaxed);
        if (r0 >= M) break;
        t->rows(&t->args, r0, KV_MIN(M, r0 + t->chunk), t->scratch[ith]);
    }
}

static void fill_nan(float *y, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = NAN;
}

int kv_mm_check(const kv_tensor *w, kv_err *err) {
    if (!w) return kv_err_set(err, KV_ERR_INVAL, "matmul: no weight tensor");
    const kv_type_traits *tr = kv_type_get((int)w->type);
    if (!tr || !(w->type == KV_TYPE_F32 || w->type == KV_TYPE_F16 || w->type == KV_TYPE_BF16 || is_quant(w->type) ||
                 kv_qext_get(w->type)))
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "cpu backend: weight type %s (%d) is not supported",
                          kv_type_name((int)w->type), (int)w->type);
    if (w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT32_MAX || w->ne1 > INT32_MAX)
        return kv_err_set(err, KV_ERR_INVAL, "cpu backend: bad weight shape %lld x %lld", (long long)w->ne1,
                          (long long)w->ne0);
    size_t rs = kv_type_row_size(w->type, w->ne0);
    if (rs == 0)
        return kv_err_set(err, KV_ERR_INVAL, "cpu backend: row length %lld is not a multiple of the %s block size",
                          (long long)w->ne0, tr->name);
    if (w->nb1 < rs)
        return kv_err_set(err, KV_ERR_INVAL, "cpu backend: row stride %zu is below the row size %zu", w->nb1, rs);
    if (!w->data) return kv_err_set(err, KV_ERR_INVAL, "cpu backend: weight has no data");
    return KV_OK;
}

/* ---- the other GGUF block types (quant_ext.h): one dot per output ------- */

typedef struct qx_task {
    kv_qext_dot_fn dot;
    kv_qext_from_f32_fn quant; /* f32 -> the dot's activation blocks */
    const float *x;            /* (n, K) */
    const uint8_t *w;          /* (M, nb1) */
    size_t nb1;
    uint8_t *act;              /* (n, arow) quantized activations */
    size_t arow;               /* bytes per quantized activation row */
    int64_t K, M;
    int n;
    float *y;                  /* (n, M) */
    int64_t chunk;             /* rows per grab */
    atomic_llong next;
} qx_task;

static void qx_quant_task(void *ctx, int ith, int nth) {
    qx_task *t = ctx;
    int j0 = (int)((int64_t)t->n * ith / nth), j1 = (int)((int64_t)t->n * (ith + 1) / nth);
    for (int j = j0; j < j1; j++) t->quant(t->x + (size_t)j * t->K, t->act + (size_t)j * t->arow, t->K);
}

static void qx_rows_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    qx_task *t = ctx;
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&t->next, t->chunk, memory_order_relaxed);
        if (r0 >= t->M) break;
        int64_t r1 = KV_MIN(t->M, r0 + t->chunk);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = t->w + (size_t)r * t->nb1;
            for (int j = 0; j < t->n; j++) t->y[(size_t)j * t->M + r] = t->dot(t->K, wr, t->act + (size_t)j * t->arow);
        }
    }
}

/* The dot of ops at our ISA level (the levels are numbered alike). */
static kv_qext_dot_fn qx_dot(const kv_qext_ops *ops, kv_cpu_isa isa) {
    if (isa == KV_CPU_ISA_SCALAR) return ops->vec_dot_ref;
    kv_qext_dot_fn f = kv_qext_vec_dot_isa(ops->type, (kv_qext_isa)isa);
    return f ? f : ops->vec_dot;
}

/* Bytes of activations qx_matmul quantizes n rows of K into (0: K does
 * not fit the activation blocks). */
static size_t qx_act_bytes(const kv_qext_ops *ops, int n, int64_t K) {
    return kv_type_row_size(ops->vec_type, K) * (size_t)n;
}

/* act: qx_act_bytes(ops, n, K) bytes, or NULL to allocate (the oracle). */
static int qx_matmul(kv_threadpool *pool, void *act, kv_cpu_isa isa, const kv_qext_ops *ops, const kv_tensor *w,
                     const float *x, float *y, int n, int nth) {
    qx_task t;
    memset(&t, 0, sizeof t);
    t.dot = qx_dot(ops, isa);
    t.quant = ops->quantize_act_row;
    t.x = x;
    t.w = w->data;
    t.nb1 = w->nb1;
    t.K = w->ne0;
    t.M = w->ne1;
    t.n = n;
    t.y = y;
    t.arow = kv_type_row_size(ops->vec_type, w->ne0);
    if (t.arow == 0) return KV_ERR_INVAL; /* K does not fit the activation blocks */
    t.act = act ? act : malloc(t.arow * (size_t)n);
    if (!t.act) return KV_ERR_NOMEM;
    if (nth > 1 && n > 1 && (double)n * (double)t.K >= KV_MM_MIN_PAR_QUANT)
        kv_threadpool_run(pool, qx_quant_task, &t);
    else
        qx_quant_task(&t, 0, 1);
    t.chunk = KV_MAX((int64_t)16, (t.M + (int64_t)nth * 4 - 1) / ((int64_t)nth * 4));
    atomic_init(&t.next, 0);
    if (nth > 1)
        kv_threadpool_run(pool, qx_rows_task, &t);
    else
        qx_rows_task(&t, 0, 1);
    if (!act) free(t.act);
    return KV_OK;
}

/* Offsets of the q8a arrays of n rows of K inside one buffer. */
typedef struct q8a_layout {
    size_t off_d, off_i, off_s, total;
} q8a_layout;

static q8a_layout q8a_layout_of(int n, int64_t K) {
    int64_t nb = K / KV_QK;
    size_t qbytes = (size_t)n * (size_t)K;
    size_t fbytes = (size_t)n * (size_t)nb * sizeof(float);
    q8a_layout l;
    l.off_d = (qbytes + 63) & ~(size_t)63;
    l.off_i = l.off_d + ((fbytes + 63) & ~(size_t)63);
    l.off_s = l.off_i + ((fbytes + 63) & ~(size_t)63);
    l.total = l.off_s + fbytes + 64;
    return l;
}

static size_t xpack_bytes(int n, int64_t K) {
    size_t groups = (size_t)(n + KV_MM_XGROUP - 1) / KV_MM_XGROUP;
    return groups * (size_t)K * KV_MM_XGROUP * sizeof(float);
}

size_t kv_mm_act_bytes(kv_type t, int n, int64_t K, kv_cpu_isa isa) {
    if (n <= 0 || K <= 0) return 0;
    const kv_qext_ops *qx = kv_qext_get(t);
    if (qx) return qx_act_bytes(qx, n, K);
    if (is_quant(t)) return q8a_layout_of(n, K).total;
    if (!kv_cpu_isa_supported(isa)) isa = KV_CPU_ISA_SCALAR;
    if (isa_kernels(isa)->xpack && n >= KV_MM_PACK_MIN_N) return xpack_bytes(n, K);
    return 0;
}

int kv_mm_run(const kv_mm_env *env, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n,
              kv_err *err) {
    if (!env || !w || !x || !y || n <= 0)
        return kv_err_set(err, KV_ERR_INVAL, "matmul: bad arguments (%d rows)", n);
    int rc = kv_mm_check(w, err);
    if (rc != KV_OK) {
        /* upload_weight rejects these up front, so reaching here is a
         * caller bug: make the result loud as well as the status. */
        if (w->ne1 > 0) fill_nan(y, (size_t)n * (size_t)w->ne1);
        return rc;
    }
    if (!kv_cpu_isa_supported(isa)) isa = KV_CPU_ISA_SCALAR;
    const kv_mm_isa_kernels *kern = isa_kernels(isa);
    kv_threadpool *pool = env->pool;
    int nth = kv_threadpool_size(pool);
    int64_t K = w->ne0, M = w->ne1;
    double macs = (double)n * (double)K * (double)M;
    if (macs < KV_MM_MIN_PAR_MACS) nth = 1;
    size_t act_need = kv_mm_act_bytes(w->type, n, K, isa);
    if (act_need > env->act_bytes || (act_need && !env->act)) {
        kv_err_set(err, KV_ERR_NOMEM, "matmul: %d x %lld %s activations need %zu bytes of scratch, %zu reserved", n,
                   (long long)K, kv_type_name((int)w->type), act_need, env->act_bytes);
        goto fail;
    }
    const kv_qext_ops *qx = kv_qext_get(w->type);
    if (qx) {
        rc = qx_matmul(pool, env->act, isa, qx, w, x, y, n, nth);
        if (rc != KV_OK) {
            kv_err_set(err, rc, "matmul: row length %lld does not fit %s's activation blocks", (long long)K,
                       kv_type_name((int)w->type));
            goto fail_rc;
        }
        return KV_OK;
    }
    size_t need = kv_mm_scratch_bytes(K);
    if (need > env->scratch_bytes || !env->scratch) {
        kv_err_set(err, KV_ERR_NOMEM, "matmul: a row of %lld needs %zu bytes of per-thread scratch, %zu reserved",
                   (long long)K, need, env->scratch_bytes);
        goto fail;
    }

    mm_task t;
    memset(&t, 0, sizeof t);
    t.args.type = w->type;
    t.args.K = K;
    t.args.M = M;
    t.args.nb1 = w->nb1;
    t.args.w = w->data;
    t.args.n = n;
    t.args.x = x;
    t.args.y = y;
    t.rows = kern->rows;
    t.quant = kern->quantize;
    t.zp = kv_mm_zero_point(w->type);
    t.scratch = env->scratch;

    if (is_quant(w->type)) {
        q8a_layout l = q8a_layout_of(n, K);
        uint8_t *buf = env->act;
        t.args.a.qs = (int8_t *)buf;
        t.args.a.d = (float *)(void *)(buf + l.off_d);
        t.args.a.ioff = (int32_t *)(void *)(buf + l.off_i);
        t.args.a.ds = (float *)(void *)(buf + l.off_s);
        if (nth > 1 && (double)n * (double)K >= KV_MM_MIN_PAR_QUANT && n > 1)
            kv_threadpool_run(pool, prep_task, &t);
        else
            prep_task(&t, 0, 1);
    } else if (kern->xpack && n >= KV_MM_PACK_MIN_N) {
        size_t groups = (size_t)(n + KV_MM_XGROUP - 1) / KV_MM_XGROUP;
        t.xp = env->act;
        t.xpack = kern->xpack;
        t.args.xp = t.xp;
        if (nth > 1 && (double)n * (double)K >= KV_MM_MIN_PAR_QUANT && groups > 1)
            kv_threadpool_run(pool, prep_task, &t);
        else
            prep_task(&t, 0, 1);
    }

    /* Row chunks: multiples of the panel height; about 4 per thread so a
     * slow (descheduled) thread does not hold up the rest. */
    int64_t chunk = (M + (int64_t)nth * 4 - 1) / ((int64_t)nth * 4);
    chunk = (chunk + KV_MM_PANEL - 1) / KV_MM_PANEL * KV_MM_PANEL;
    t.chunk = KV_MAX(chunk, (int64_t)KV_MM_PANEL);
    atomic_init(&t.next, 0);
    if (nth == 1)
        t.rows(&t.args, 0, M, env->scratch[0]);
    else
        kv_threadpool_run(pool, rows_task, &t);
    return KV_OK;
fail:
    rc = KV_ERR_NOMEM;
fail_rc:
    fill_nan(y, (size_t)n * (size_t)M);
    return rc;
}

int kv_cpu_matmul_ref(const kv_tensor *w, const float *x, float *y, int n) {
    if (!w || !x || !y || n < 0) return KV_ERR_INVAL;
    int rc = kv_mm_check(w, NULL);
    if (rc != KV_OK) return rc;
    if (n == 0) return KV_OK;
    const kv_qext_ops *qx = kv_qext_get(w->type);
    if (qx) return qx_matmul(NULL, NULL, KV_CPU_ISA_SCALAR, qx, w, x, y, n, 1);
    kv_mm_args a;
    memset(&a, 0, sizeof a);
    a.type = w->type;
    a.K = w->ne0;
    a.M = w->ne1;
    a.nb1 = w->nb1;
    a.w = w->data;
    a.n = n;
    a.x = x;
    a.y = y;
    void *buf = NULL;
    if (is_quant(w->type)) {
        int64_t nb = a.K / KV_QK;
        size_t per = (size_t)n * (size_t)nb;
        buf = malloc(per * (KV_QK + 3 * sizeof(float)));
        if (!buf) return KV_ERR_NOMEM;
        a.a.d = buf;
        a.a.ds = a.a.d + per;
        a.a.ioff = (int32_t *)(a.a.ds + per);
        a.a.qs = (int8_t *)(a.a.ioff + per);
        int zp = kv_mm_zero_point(w->type);
        for (int j = 0; j < n; j++)
            kv_q8a_row_ref(x + (size_t)j * a.K, a.K, (size_t)n, a.a.qs + (size_t)j * KV_QK, a.a.d + j, a.a.ioff + j,
                           a.a.ds + j, zp);
    }
    kv_mm_rows_ref(&a, 0, a.M, NULL);
    free(buf);
    return KV_OK;
}
