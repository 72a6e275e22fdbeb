/* matmul.c - the CPU matmul driver and its scalar reference.
 * kv_mm_run_multi (kv_mm_run is its one-weight case) quantizes the
 * activations once per call and activation format (quantized weights),
 * then splits the rows of all its weights over the pool's threads in one
 * dispatch; each thread runs the selected ISA's row kernel, which reads
 * each weight row block once for all n activation rows. The scalar kernels here are the oracle of the tests and
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

/* The block types of this file's kernels (q8a activations); q5_0 is q4_0
 * with a fifth bit, so it runs q4_0's kernels, not quant_ext's dots. */
static int is_quant(kv_type t) {
    return t == KV_TYPE_Q8_0 || t == KV_TYPE_Q4_0 || t == KV_TYPE_Q4_1 || t == KV_TYPE_Q5_0;
}

/* The ops of a quant_ext type this file hands to quant_ext's dots, or NULL
 * (this file's own block types, float weights, unknown types). */
static const kv_qext_ops *qext_of(kv_type t) { return is_quant(t) ? NULL : kv_qext_get(t); }

int kv_mm_zero_point(kv_type t) {
    switch (t) {
    case KV_TYPE_Q8_0:
        return 128;
    case KV_TYPE_Q4_0:
        return 8;
    case KV_TYPE_Q5_0:
        return 16;
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
        } else if (t == KV_TYPE_Q5_0) {
            const uint32_t qh = kv_mm_q5_qh(w);
            const uint8_t *q = w + 6;
            for (int i = 0; i < KV_QK / 2; i++) {
                isum += (int)((q[i] & 0x0F) | ((qh >> i) & 1) << 4) * aq[i] - 16 * aq[i];
                isum += (int)((q[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) * aq[i + KV_QK / 2] - 16 * aq[i + KV_QK / 2];
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

/* ---- pre-packed panels --------------------------------------------------- */

size_t kv_mm_panels_bytes(const kv_tensor *w, kv_cpu_isa isa) {
    /* NOTE: q4_0 and q4_1 were left out while a panel kept its headers
     * apart from its quants (SmolLM2's Q4_1 decode ran 5-10% slower on
     * them than on the direct tiles); read as one stream they are faster */
    if (!w || isa != KV_CPU_ISA_AVX512) return 0;
    if (w->type == KV_TYPE_Q4_K) /* quant_ext's panels (kv_qext_panel_pack) */
        return kv_qext_panels_isa(w->type, KV_QEXT_ISA_AVX512) ? kv_qext_panel_bytes(w->type, w->ne0, w->ne1) : 0;
    const int typed = w->type == KV_TYPE_Q8_0 || w->type == KV_TYPE_Q5_0 || w->type == KV_TYPE_Q4_0 ||
                      w->type == KV_TYPE_Q4_1;
    if (!typed || w->ne0 % KV_QK || w->ne1 <= 0)
        return 0;
    const size_t panels = (size_t)(w->ne1 + KV_MM_PANEL - 1) / KV_MM_PANEL;
    return panels * kv_mm_panel_stride(w->type, w->ne0 / KV_QK);
}

typedef struct panel_task {
    const kv_tensor *w;
    uint8_t *dst;
    int64_t panels;
} panel_task;

/* Panels [p0, p1) of one thread's share: a plain byte shuffle, once per
 * weight, so it stays portable C. */
static void panel_run(void *ctx, int ith, int nth) {
    const panel_task *t = ctx;
    const kv_tensor *w = t->w;
    const kv_type ty = w->type;
    const int64_t nb = w->ne0 / KV_QK;
    const size_t bs = kv_mm_qblk_bytes(ty), qo = kv_mm_qblk_qoff(ty);
    const int64_t p0 = t->panels * ith / nth, p1 = t->panels * (ith + 1) / nth;
    if (ty == KV_TYPE_Q4_K) {
        kv_qext_panel_pack(ty, w->data, w->nb1, w->ne1, w->ne0, p0, p1, t->dst);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        uint8_t *pp = t->dst + (size_t)p * kv_mm_panel_stride(ty, nb);
        memset(pp, 0, kv_mm_panel_stride(ty, nb)); /* missing rows and blocks, masks */
        for (int rr = 0; rr < KV_MM_PANEL; rr++) {
            const int64_t r = p * KV_MM_PANEL + rr;
            if (r >= w->ne1) break;
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->nb1;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * bs;
                uint8_t *h = pp + kv_mm_panel_hoff(ty, b), *q = pp + kv_mm_panel_qoff(ty, b) + rr * 4;
                __builtin_memcpy(h + 2 * rr, blk, 2); /* d */
                if (ty == KV_TYPE_Q4_1) __builtin_memcpy(h + 32 + 2 * rr, blk + 2, 2); /* m */
                if (ty == KV_TYPE_Q5_0) {
                    const uint32_t qh = kv_mm_q5_qh(blk);
                    for (int G = 0; G < 8; G++) { /* mask G, bits 4rr..4rr+3 */
                        uint64_t m;
                        __builtin_memcpy(&m, h + 32 + 8 * G, 8);
                        m |= (uint64_t)((qh >> (4 * G)) & 0xF) << (4 * rr);
                        __builtin_memcpy(h + 32 + 8 * G, &m, 8);
                    }
                }
                for (int g = 0; g < (ty == KV_TYPE_Q8_0 ? 8 : 4); g++) { /* 4 bytes at a time */
                    uint32_t v;
                    __builtin_memcpy(&v, blk + qo + 4 * g, 4);
                    if (ty == KV_TYPE_Q8_0) v ^= 0x80808080u; /* unsigned */
                    __builtin_memcpy(q + g * 64, &v, 4);
                }
            }
        }
    }
}

void kv_mm_panels_pack(const kv_tensor *w, uint8_t *dst, kv_threadpool *pool) {
    panel_task t = {w, dst, (w->ne1 + KV_MM_PANEL - 1) / KV_MM_PANEL};
    if (pool && kv_threadpool_size(pool) > 1 && t.panels > 1)
        kv_threadpool_run(pool, panel_run, &t);
    else
        panel_run(&t, 0, 1);
}

/* ---- ISA table ----------------------------------------------------------- */

static const kv_mm_isa_kernels *isa_kernels(kv_cpu_isa isa) {
    static const kv_mm_isa_kernels tab[KV_CPU_ISA_COUNT] = {
        [KV_CPU_ISA_SCALAR] = {kv_mm_rows_ref, kv_q8a_row_ref, NULL},
#ifdef KV_HAVE_X86_KERNELS
        [KV_CPU_ISA_AVX2] = {kv_mm_rows_avx2, kv_q8a_row_avx2, kv_mm_xpack_avx2},
        [KV_CPU_ISA_AVX512] = {kv_mm_rows_avx512, kv_q8a_row_avx512, NULL},
#endif
    };
    if ((int)isa < 0 || isa >= KV_CPU_ISA_COUNT || !tab[isa].rows) return &tab[KV_CPU_ISA_SCALAR];
    return &tab[isa];
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

/* ---- the other GGUF block types (quant_ext.h): tiled dots where the ---- */
/* ---- level has them (kv_qext_rows_isa), else one dot per output ------ */

/* The dot of ops at our ISA level (the levels are numbered alike). */
static kv_qext_dot_fn qx_dot(const kv_qext_ops *ops, kv_cpu_isa isa) {
    if (isa == KV_CPU_ISA_SCALAR) return ops->vec_dot_ref;
    kv_qext_dot_fn f = kv_qext_vec_dot_isa(ops->type, (kv_qext_isa)isa);
    return f ? f : ops->vec_dot;
}

/* Bytes of activations the driver quantizes n rows of K into (0: K does
 * not fit the activation blocks). */
static size_t qx_act_bytes(const kv_qext_ops *ops, int n, int64_t K) {
    return kv_type_row_size(ops->vec_type, K) * (size_t)n;
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
    const kv_qext_ops *qx = qext_of(t);
    if (qx) return qx_act_bytes(qx, n, K);
    if (is_quant(t)) return q8a_layout_of(n, K).total;
    if (!kv_cpu_isa_supported(isa)) isa = KV_CPU_ISA_SCALAR;
    if (isa_kernels(isa)->xpack && n >= KV_MM_PACK_MIN_N) return xpack_bytes(n, K);
    return 0;
}

/* ---- the driver: groups of up to KV_MATMUL_MULTI_MAX weights of one input */

/* The most weights (segments) one pass takes: its task lives on the stack. A
 * call with more runs several passes. */
#define MM_PASS_SEGS 48

/* One weight of a pass: the kernels' arguments (args.a / args.xp: the
 * activations it reads), or for the quant_ext types its dot over qact. */
typedef struct mm_seg {
    kv_mm_args args;
    kv_qext_dot_fn dot; /* non-NULL: quant_ext type */
    kv_qext_rows_fn qrows; /* its tiled dots (same results), or NULL */
    kv_qext_panels_fn qpanels; /* the same over its pre-packed panels (args.wp), or NULL */
    const uint8_t *qact; /* (n, arow) its quantized activations */
    size_t arow;
    int64_t c0;          /* its first chunk in the pass's numbering */
} mm_seg;

typedef struct mm_task {
    mm_seg *seg;
    int nseg;
    kv_mm_rows_fn rows;
    void *const *scratch; /* (nth) per-thread scratch; NULL for quant_ext-only calls */
    int64_t chunk;        /* rows per grab */
    int64_t nchunks;      /* of all segments */
    atomic_llong next;    /* next unclaimed chunk */
} mm_task;

static void seg_rows(kv_mm_rows_fn rows, const mm_seg *s, int64_t r0, int64_t r1, void *scratch) {
    const kv_mm_args *a = &s->args;
    if (!s->dot) {
        rows(a, r0, r1, scratch);
        return;
    }
    if (s->qpanels && r0 % KV_MM_PANEL == 0) {
        const uint8_t *pp = a->wp + (size_t)(r0 / KV_MM_PANEL) * kv_qext_panel_stride(a->type, a->K);
        s->qpanels(a->K, pp, (int)(r1 - r0), s->qact, s->arow, a->n, a->y + r0, (size_t)a->M);
        return;
    }
    if (s->qrows) {
        s->qrows(a->K, a->w + (size_t)r0 * a->nb1, a->nb1, (int)(r1 - r0), s->qact, s->arow, a->n, a->y + r0,
                 (size_t)a->M);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = a->w + (size_t)r * a->nb1;
        for (int j = 0; j < a->n; j++) a->y[(size_t)j * a->M + r] = s->dot(a->K, wr, s->qact + (size_t)j * s->arow);
    }
}

/* Chunks of every segment's rows, claimed one at a time. */
static void rows_task(void *ctx, int ith, int nth) {
    (void)nth;
    mm_task *t = ctx;
    void *scratch = t->scratch ? t->scratch[ith] : NULL;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c >= t->nchunks) break;
        int lo = 0, hi = t->nseg - 1; /* the last segment that starts at or before c */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (t->seg[mid].c0 <= c) lo = mid;
            else hi = mid - 1;
        }
        const mm_seg *s = &t->seg[lo];
        int64_t r0 = (c - s->c0) * t->chunk;
        seg_rows(t->rows, s, r0, KV_MIN(s->args.M, r0 + t->chunk), scratch);
    }
}

/* The activation format a weight type reads: none (float weights read x
 * as is), q8a with a zero point, quant_ext blocks, or packed floats.
 * Weights of one format and one x share one preparation of it. */
typedef struct act_fmt {
    enum { ACT_NONE, ACT_Q8A, ACT_QEXT, ACT_XPACK } kind;
    int zp;
    const kv_qext_ops *qx;
} act_fmt;

static act_fmt act_fmt_of(kv_type t, const kv_mm_isa_kernels *kern, int n) {
    act_fmt f = {ACT_NONE, 0, qext_of(t)};
    if (f.qx)
        f.kind = ACT_QEXT;
    else if (is_quant(t))
        f.kind = ACT_Q8A, f.zp = kv_mm_zero_point(t);
    else if (kern->xpack && n >= KV_MM_PACK_MIN_N)
        f.kind = ACT_XPACK;
    return f;
}

static int act_fmt_eq(act_fmt a, act_fmt b) {
    if (a.kind != b.kind) return 0;
    if (a.kind == ACT_Q8A) return a.zp == b.zp;
    if (a.kind == ACT_QEXT) return a.qx->vec_type == b.qx->vec_type && a.qx->quantize_act_row == b.qx->quantize_act_row;
    return 1;
}

/* The bytes of env->act the activations of one x take in a pass: once per
 * format among the group's weights, each rounded up to 64. */
static size_t group_act_bytes(const kv_matmul_group *g, kv_cpu_isa isa, const kv_mm_isa_kernels *kern) {
    act_fmt f[KV_MATMUL_MULTI_MAX];
    size_t bytes = 0;
    for (int i = 0; i < g->nw; i++) {
        f[i] = act_fmt_of(g->w[i]->type, kern, g->n);
        int j = 0;
        while (j < i && !act_fmt_eq(f[j], f[i])) j++;
        if (j == i) bytes += (kv_mm_act_bytes(g->w[i]->type, g->n, g->w[i]->ne0, isa) + 63) & ~(size_t)63;
    }
    return bytes;
}

/* One preparation of an x(n, K): its rows quantized (q8a or quant_ext),
 * or groups of rows packed. Units: rows, or packed groups. */
typedef struct prep_job {
    act_fmt f;
    const float *x;
    int64_t K;
    int n;
    kv_q8a a;
    uint8_t *qact;
    size_t arow;
    float *xp;
} prep_job;

typedef struct prep_task {
    const prep_job *job;
    int njob;
    int64_t units; /* of all jobs */
    kv_q8a_row_fn quant;
    kv_mm_xpack_fn xpack;
} prep_task;

static int64_t job_units(const prep_job *jb) {
    return jb->f.kind == ACT_XPACK ? (jb->n + KV_MM_XGROUP - 1) / KV_MM_XGROUP : jb->n;
}

static void prep_units(const prep_task *p, const prep_job *jb, int u0, int u1) {
    const int64_t K = jb->K;
    if (jb->f.kind == ACT_XPACK) {
        for (int g = u0; g < u1; g++)
            p->xpack(jb->x + (size_t)g * KV_MM_XGROUP * (size_t)K, KV_MIN(jb->n - g * KV_MM_XGROUP, KV_MM_XGROUP), K,
                     jb->xp + (size_t)g * (size_t)K * KV_MM_XGROUP);
        return;
    }
    for (int j = u0; j < u1; j++) {
        const float *xr = jb->x + (size_t)j * K;
        if (jb->f.kind == ACT_QEXT)
            jb->f.qx->quantize_act_row(xr, jb->qact + (size_t)j * jb->arow, K);
        else
            p->quant(xr, K, (size_t)jb->n, jb->a.qs + (size_t)j * KV_QK, jb->a.d + j, jb->a.ioff + j, jb->a.ds + j,
                     jb->f.zp);
    }
}

/* A thread's share of the units of all jobs, taken in order. */
static void prep_run(void *ctx, int ith, int nth) {
    const prep_task *p = ctx;
    const int64_t u0 = p->units * ith / nth, u1 = p->units * (ith + 1) / nth;
    int64_t base = 0;
    for (int i = 0; i < p->njob && base < u1; i++) {
        const int64_t u = job_units(&p->job[i]), lo = KV_MAX(u0, base), hi = KV_MIN(u1, base + u);
        if (lo < hi) prep_units(p, &p->job[i], (int)(lo - base), (int)(hi - base));
        base += u;
    }
}

/* Prepares every segment's x once per activation format (and x), side by
 * side in env->act, and points each segment at its own; all of them in one
 * dispatch when the work is large enough. */
static int prep_acts(const kv_mm_env *env, kv_cpu_isa isa, const kv_mm_isa_kernels *kern, mm_task *t, int nth,
                     kv_err *err) {
    act_fmt fmt[MM_PASS_SEGS];
    prep_job job[MM_PASS_SEGS];
    int njob = 0;
    const size_t cap = env->act_bytes * (size_t)KV_MAX(env->act_regions, 1);
    size_t used = 0;
    double elems = 0;
    int64_t units = 0;
    for (int i = 0; i < t->nseg; i++) {
        mm_seg *s = &t->seg[i];
        const kv_mm_args *a = &s->args;
        fmt[i] = act_fmt_of(a->type, kern, a->n);
        if (fmt[i].kind == ACT_QEXT) {
            s->dot = qx_dot(fmt[i].qx, isa);
            s->qrows = isa == KV_CPU_ISA_SCALAR ? NULL : kv_qext_rows_isa(a->type, (kv_qext_isa)isa);
            s->qpanels = a->wp && s->qrows ? kv_qext_panels_isa(a->type, (kv_qext_isa)isa) : NULL;
            s->arow = kv_type_row_size(fmt[i].qx->vec_type, a->K);
            if (s->arow == 0)
                return kv_err_set(err, KV_ERR_INVAL, "matmul: row length %lld does not fit %s's activation blocks",
                                  (long long)a->K, kv_type_name((int)a->type));
        }
        int j = 0;
        while (j < i && !(act_fmt_eq(fmt[j], fmt[i]) && t->seg[j].args.x == a->x && t->seg[j].args.n == a->n &&
                          t->seg[j].args.K == a->K))
            j++;
        if (j < i) { /* the same format of the same x as an earlier weight: its activations */
            s->args.a = t->seg[j].args.a;
            s->args.xp = t->seg[j].args.xp;
            s->qact = t->seg[j].qact;
            continue;
        }
        size_t need = kv_mm_act_bytes(a->type, a->n, a->K, isa);
        if (fmt[i].kind == ACT_NONE || need == 0) continue;
        need = (need + 63) & ~(size_t)63;
        /* one x in one format takes at most a region (what reserve sized
         * for its max_rows); several side by side take the regions' room */
        if (!env->act || need > env->act_bytes)
            return kv_err_set(err, KV_ERR_NOMEM, "matmul: %d x %lld %s activations need %zu bytes of scratch, %zu reserved",
                              a->n, (long long)a->K, kv_type_name((int)a->type), need, env->act ? env->act_bytes : 0);
        if (used + need > cap)
            return kv_err_set(err, KV_ERR_NOMEM, "matmul: %d activation buffers need more than the %zu bytes reserved",
                              njob + 1, cap);
        uint8_t *buf = (uint8_t *)env->act + used;
        used += need;
        prep_job *jb = &job[njob++];
        *jb = (prep_job){.f = fmt[i], .x = a->x, .K = a->K, .n = a->n};
        if (fmt[i].kind == ACT_Q8A) {
            q8a_layout l = q8a_layout_of(a->n, a->K);
            jb->a.qs = (int8_t *)buf;
            jb->a.d = (float *)(void *)(buf + l.off_d);
            jb->a.ioff = (int32_t *)(void *)(buf + l.off_i);
            jb->a.ds = (float *)(void *)(buf + l.off_s);
            s->args.a = jb->a;
        } else if (fmt[i].kind == ACT_QEXT) {
            jb->qact = buf;
            jb->arow = s->arow;
            s->qact = buf;
        } else {
            jb->xp = (float *)(void *)buf;
            s->args.xp = jb->xp;
        }
        elems += (double)a->n * (double)a->K;
        units += job_units(jb);
    }
    prep_task p = {.job = job, .njob = njob, .units = units, .quant = kern->quantize, .xpack = kern->xpack};
    if (nth > 1 && elems >= KV_MM_MIN_PAR_QUANT && units > 1)
        kv_threadpool_run(env->pool, prep_run, &p);
    else if (njob)
        prep_run(&p, 0, 1);
    return KV_OK;
}

/* Validates a call: 0, or an error (and every y that has a known size
 * filled with NaN, so that an unchecked result is loud). */
static int groups_check(const kv_mm_env *env, const kv_matmul_group *g, int ng, kv_err *err) {
    if (!env || !g || ng < 1) return kv_err_set(err, KV_ERR_INVAL, "matmul: bad arguments (%d groups)", ng);
    for (int k = 0; k < ng; k++) {
        if (!g[k].x || g[k].n <= 0 || g[k].nw < 1 || g[k].nw > KV_MATMUL_MULTI_MAX)
            return kv_err_set(err, KV_ERR_INVAL, "matmul: bad arguments (%d rows, %d weights)", g[k].n, g[k].nw);
        for (int i = 0; i < g[k].nw; i++)
            if (!g[k].w[i] || !g[k].y[i]) return kv_err_set(err, KV_ERR_INVAL, "matmul: no weight or output %d", i);
    }
    int rc = KV_OK;
    for (int k = 0; k < ng && rc == KV_OK; k++)
        for (int i = 0; i < g[k].nw && rc == KV_OK; i++) {
            const kv_tensor *w = g[k].w[i];
            rc = kv_mm_check(w, err);
            if (rc == KV_OK && w->ne0 != g[k].w[0]->ne0)
                rc = kv_err_set(err, KV_ERR_INVAL, "matmul: weight %d has rows of %lld, weight 0 of %lld", i,
                                (long long)w->ne0, (long long)g[k].w[0]->ne0);
        }
    /* upload_weight rejects bad weights up front, so reaching here is a
     * caller bug: make the result loud as well as the status. */
    if (rc != KV_OK)
        for (int k = 0; k < ng; k++)
            for (int i = 0; i < g[k].nw; i++)
                if (g[k].w[i]->ne1 > 0) fill_nan(g[k].y[i], (size_t)g[k].n * (size_t)g[k].w[i]->ne1);
    return rc;
}

/* One pass: the ng groups' x prepared, then the rows of all their weights
 * (<= MM_PASS_SEGS) split over the threads in one dispatch. */
static int run_pass(const kv_mm_env *env, kv_cpu_isa isa, const kv_mm_isa_kernels *kern, const kv_matmul_group *g,
                    int ng, kv_err *err) {
    mm_seg seg[MM_PASS_SEGS];
    mm_task t;
    memset(&t, 0, sizeof t);
    int used = 0; /* clear only the segments this pass fills (every matmul call runs a pass) */
    for (int k = 0; k < ng; k++) used += g[k].nw;
    memset(seg, 0, sizeof *seg * (size_t)used);
    t.seg = seg;
    t.rows = kern->rows;
    t.scratch = env->scratch;
    int nth = kv_threadpool_size(env->pool), need_scratch = 0;
    int64_t Mtot = 0, Kmax = 0;
    double macs = 0;
    for (int k = 0; k < ng; k++)
        for (int i = 0; i < g[k].nw; i++) {
            const kv_tensor *w = g[k].w[i];
            kv_mm_args *a = &seg[t.nseg++].args;
            a->type = w->type;
            a->K = w->ne0;
            a->M = w->ne1;
            a->nb1 = w->nb1;
            a->w = w->data;
            a->n = g[k].n;
            a->x = g[k].x;
            a->y = g[k].y[i];
            a->wp = env->panels && kv_mm_panels_bytes(w, isa) ? env->panels(env->owner, w) : NULL;
            Mtot += a->M;
            Kmax = KV_MAX(Kmax, a->K);
            macs += (double)a->n * (double)a->K * (double)a->M;
            need_scratch |= !qext_of(w->type);
        }
    if (macs < KV_MM_MIN_PAR_MACS) nth = 1;
    size_t need = kv_mm_scratch_bytes(Kmax);
    if (need_scratch && (need > env->scratch_bytes || !env->scratch))
        return kv_err_set(err, KV_ERR_NOMEM, "matmul: a row of %lld needs %zu bytes of per-thread scratch, %zu reserved",
                          (long long)Kmax, need, env->scratch_bytes);
    int rc = prep_acts(env, isa, kern, &t, nth, err);
    if (rc != KV_OK) return rc;

    /* Row chunks: multiples of the panel height; about 4 per thread over
     * all the weights so a slow (descheduled) thread does not hold up the
     * rest. A chunk stays inside one weight. */
    int64_t chunk = (Mtot + (int64_t)nth * 4 - 1) / ((int64_t)nth * 4);
    chunk = (chunk + KV_MM_PANEL - 1) / KV_MM_PANEL * KV_MM_PANEL;
    t.chunk = KV_MAX(chunk, (int64_t)KV_MM_PANEL);
    for (int i = 0; i < t.nseg; i++) {
        seg[i].c0 = t.nchunks;
        t.nchunks += (seg[i].args.M + t.chunk - 1) / t.chunk;
    }
    atomic_init(&t.next, 0);
    if (nth == 1)
        for (int i = 0; i < t.nseg; i++)
            seg_rows(t.rows, &seg[i], 0, seg[i].args.M, env->scratch ? env->scratch[0] : NULL);
    else
        kv_threadpool_run(env->pool, rows_task, &t);
    return KV_OK;
}

int kv_mm_run_groups(const kv_mm_env *env, kv_cpu_isa isa, const kv_matmul_group *g, int ng, kv_err *err) {
    int rc = groups_check(env, g, ng, err);
    if (rc != KV_OK) return rc;
    if (!kv_cpu_isa_supported(isa)) isa = KV_CPU_ISA_SCALAR;
    const kv_mm_isa_kernels *kern = isa_kernels(isa);
    const size_t cap = env->act_bytes * (size_t)KV_MAX(env->act_regions, 1);
    /* passes of consecutive groups: as many as the segments and the
     * activation buffer take (a group alone that does not fit fails in
     * prep_acts, naming the bytes) */
    for (int k0 = 0; k0 < ng;) {
        int k1 = k0, nseg = 0;
        size_t bytes = 0;
        while (k1 < ng && nseg + g[k1].nw <= MM_PASS_SEGS) {
            const size_t b = group_act_bytes(&g[k1], isa, kern);
            if (k1 > k0 && bytes + b > cap) break;
            bytes += b;
            nseg += g[k1++].nw;
        }
        if ((rc = run_pass(env, isa, kern, g + k0, k1 - k0, err)) != KV_OK) goto fail;
        k0 = k1;
    }
    return KV_OK;
fail:
    for (int k = 0; k < ng; k++)
        for (int i = 0; i < g[k].nw; i++) fill_nan(g[k].y[i], (size_t)g[k].n * (size_t)g[k].w[i]->ne1);
    return rc;
}

int kv_mm_run_multi(const kv_mm_env *env, kv_cpu_isa isa, const kv_tensor *const *w, int nw, const float *x,
                    float *const *y, int n, kv_err *err) {
    if (!w || !y || nw < 1 || nw > KV_MATMUL_MULTI_MAX)
        return kv_err_set(err, KV_ERR_INVAL, "matmul: bad arguments (%d rows, %d weights)", n, nw);
    kv_matmul_group g = {.nw = nw, .x = x, .n = n};
    for (int i = 0; i < nw; i++) g.w[i] = w[i], g.y[i] = y[i];
    return kv_mm_run_groups(env, isa, &g, 1, err);
}

int kv_mm_run(const kv_mm_env *env, kv_cpu_isa isa, const kv_tensor *w, const float *x, float *y, int n,
              kv_err *err) {
    return kv_mm_run_multi(env, isa, &w, 1, x, &y, n, err);
}

int kv_cpu_matmul_ref(const kv_tensor *w, const float *x, float *y, int n) {
    if (!w || !x || !y || n < 0) return KV_ERR_INVAL;
    int rc = kv_mm_check(w, NULL);
    if (rc != KV_OK) return rc;
    if (n == 0) return KV_OK;
    const kv_qext_ops *qx = qext_of(w->type);
    if (qx) {
        mm_seg sg = {.args = {.type = w->type, .K = w->ne0, .M = w->ne1, .nb1 = w->nb1, .w = w->data, .n = n, .x = x, .y = y},
                     .dot = qx->vec_dot_ref, .arow = kv_type_row_size(qx->vec_type, w->ne0)};
        if (sg.arow == 0) return KV_ERR_INVAL; /* K does not fit the activation blocks */
        uint8_t *act = malloc(qx_act_bytes(qx, n, w->ne0));
        if (!act) return KV_ERR_NOMEM;
        for (int j = 0; j < n; j++) qx->quantize_act_row(x + (size_t)j * w->ne0, act + (size_t)j * sg.arow, w->ne0);
        sg.qact = act;
        seg_rows(kv_mm_rows_ref, &sg, 0, w->ne1, NULL);
        free(act);
        return KV_OK;
    }
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
