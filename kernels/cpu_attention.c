/* cpu_attention.c - the CPU backend's paged KV ops: store K/V rows into
 * their slots (encoding to the cache dtype), copy blocks, and attention over
 * block tables with an online (flash-attention style) softmax. A work item
 * is a run of tokens of one sequence (part of a prefill chunk, or one
 * decode token) and a range of query heads; it reads each K/V tile of a kv
 * head once for all of its rows (tokens x the query heads of the GQA group).
 * Threads take items from a shared counter. Scalar reference kernels here,
 * AVX2 and AVX-512 ones in cpu_attention_avx2.c / cpu_attention_avx512.c,
 * picked at run time; the SIMD kernels read every dtype in place (int8 and
 * fp8 expanded in registers), the scalar path decodes the quantized dtypes
 * a tile at a time with the reference decoder. No allocation.
 *
 * Batch invariance: a row's result is the same sequence of float operations
 * whatever else shares its item, its thread or its kernel call (tiles are
 * fixed by absolute position, each row keeps its own softmax state and
 * context length, and the kernels treat every row and every key alike), so
 * a token's output does not depend on the batch or on the thread count. */
#include "cpu_attention.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_attention_isa.h"

#define ATTN_ROWS 64    /* rows (token x query head) of one work item */
#define ATTN_RUN 16     /* tokens of one sequence in one work item (at most) */
#define ATTN_QBUF 8192  /* floats of decoded K or V rows (the scalar reference path) */
#define ATTN_ITEMS 1024 /* work items per dispatch; larger batches take several */
#define ATTN_SPLIT 512  /* context positions of one chunk (rounded up to whole blocks) */
#define ATTN_MACC (ATTN_ROWS * 256) /* floats of an item's merged accumulators: 64 rows up to head_dim 256 */
/* Blocks ahead of the one being read whose rows are asked into L2 (see
 * far_prefetch). */
#define ATTN_FAR 2

/* ---- scalar reference ---- */

static void scores_scalar(const float *const *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                          kv_cache_dtype d, float scale, float *s, int ss, attn_pf *pf) {
    const int f16 = d == KV_CACHE_F16;
    for (int t = 0; t < nt; t++) {
        attn_pf_step(pf, t);
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nr; h++) {
            float acc = 0.0f;
            for (int i = 0; i < hd; i++) acc += q[h][i] * ld_scalar(r, f16, i);
            s[h * ss + t] = acc * scale;
        }
    }
}

static void accum_scalar(float *const *acc, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                         kv_cache_dtype d, const float *p, int ps, attn_pf *pf) {
    const int f16 = d == KV_CACHE_F16;
    for (int t = 0; t < nt; t++) {
        attn_pf_step(pf, t);
        const uint8_t *r = rows + (size_t)t * stride;
        for (int h = 0; h < nr; h++) {
            float w = p[h * ps + t];
            float *a = acc[h];
            for (int i = 0; i < hd; i++) a[i] += w * ld_scalar(r, f16, i);
        }
    }
}

static float expsum_scalar(float *s, int n, float m) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s[i] = expf(s[i] - m);
        sum += s[i];
    }
    return sum;
}

static float maxf_scalar(const float *s, int n) {
    float mx = s[0];
    for (int i = 1; i < n; i++) mx = s[i] > mx ? s[i] : mx; /* (fmaxf is a libm call) */
    return mx;
}

static void scalev_scalar(float *a, int n, float f) {
    for (int i = 0; i < n; i++) a[i] *= f;
}

/* The integer int8 path's reference (kv_attn_kernels.scores_q8): the exact
 * int32 dot, then the shared score formula; the SIMD kernels match it bit
 * for bit. Not in k_scalar's table: the scalar path stays the float one. */
static void scores_q8_scalar(const int8_t *const *qq, const float *qd, const int32_t *qsum, int nr, int hd,
                             const uint8_t *rows, size_t stride, int nt, float scale, float *s, int ss, attn_pf *pf) {
    (void)qsum;
    for (int t = 0; t < nt; t++) {
        attn_pf_step(pf, t);
        const uint8_t *r = rows + (size_t)t * stride;
        const float ks = row_scale(r, hd, KV_CACHE_INT8);
        for (int h = 0; h < nr; h++) {
            int32_t d = 0;
            for (int i = 0; i < hd; i++) d += (int32_t)qq[h][i] * (int8_t)r[i];
            s[h * ss + t] = attn_q8_score(d, scale * qd[h], ks);
        }
    }
}

static const kv_attn_kernels k_scalar = {scores_scalar, accum_scalar, expsum_scalar, maxf_scalar, scalev_scalar,
                                      ATTN_DT_BIT(KV_CACHE_F32) | ATTN_DT_BIT(KV_CACHE_F16), NULL};

/* The scalar path's decoder: the reference row decoder, tile rows into dst(nt, hd). */
static void decode_rows(kv_cache_dtype d, const uint8_t *src, size_t stride, int nt, int hd, float *dst) {
    for (int t = 0; t < nt; t++) kv_dtype_decode_row(d, src + (size_t)t * stride, dst + (size_t)t * hd, hd);
}

static const kv_attn_kernels *kernels_for(kv_cpu_isa isa) {
#ifdef KV_HAVE_X86_KERNELS
    switch (kv_cpu_isa_usable(isa)) {
    case KV_CPU_ISA_AVX512: return &kv_attn_kernels_avx512;
    case KV_CPU_ISA_AVX2: return &kv_attn_kernels_avx2;
    default: break;
    }
#endif
    (void)isa;
    return &k_scalar;
}

/* ---- attention ---- */

/* One work item: batch tokens [tok, tok + ntok), all of one sequence with
 * non-decreasing positions, and query heads [h0, h1); at most ATTN_ROWS rows. */
typedef struct attn_item {
    int32_t tok, ntok;
    int32_t h0, h1;
    int32_t chunk; /* -1: the whole context; k >= 0: chunk k only, its state to the job's partials */
} attn_item;

typedef struct attn_job {
    const kv_attn_kernels *kern;
    const kv_pages *kv;
    int layer;
    const kv_attn_batch *ab;
    const float *q;   /* (n_tokens, n_heads, head_dim) */
    float *out;       /* (n_tokens, n_heads, head_dim) */
    int n_heads;
    float scale;
    int window;       /* > 0: a token at position p sees positions > p - window only */
    int q8;           /* 1: int8 keys scored in integers against int8 queries (kern->scores_q8) */
    int tile;         /* context tokens per softmax step: min(ATTN_TILE, ATTN_QBUF / head_dim) */
    int split;        /* context positions per chunk (a multiple of the block size) */
    float *part;      /* chunk items' states: (n_tokens, n_heads, n_chunks) slots of head_dim + 2 floats */
    int n_chunks;     /* chunks per row in part */
    const attn_item *items; /* (n_items) */
    int n_items;
    _Alignas(64) atomic_int next; /* the next item not yet taken (own cache line: every thread bumps it) */
} attn_job;

/* Row t0 of kv head g in block `phys` of the job's layer, with the block
 * known (no division by the block size: it ran for every tile and head). */
static const uint8_t *block_row(const attn_job *j, const uint8_t *pool, int phys, int t0, int g) {
    return pool + kv_pages_block_row_offset(j->kv, j->layer, phys, t0, g);
}

/* The nt rows of kv head g at block position t0 of block `phys`, readable
 * by the kernels: in place when they read the dtype, else decoded into buf
 * (*d becomes f32). */
static const uint8_t *tile_rows(const attn_job *j, const uint8_t *pool, int phys, int t0, int nt, int g,
                                float *buf, size_t *stride, kv_cache_dtype *d) {
    const kv_pages *kv = j->kv;
    const uint8_t *base = block_row(j, pool, phys, t0, g);
    if (j->kern->direct & ATTN_DT_BIT(kv->dtype)) {
        *stride = kv->row_bytes;
        *d = kv->dtype;
        return base;
    }
    decode_rows(kv->dtype, base, kv->row_bytes, nt, kv->head_dim, buf);
    *stride = (size_t)kv->head_dim * sizeof(float);
    *d = KV_CACHE_F32;
    return (const uint8_t *)buf;
}

/* The span of the next tile's rows of kv head g in K or V (pf: block,
 * offset, rows; one contiguous range, the block layout groups rows by
 * head), for the kernels to prefetch as they go (attn_pf). */
static attn_pf pf_span(const attn_job *j, const uint8_t *pool, const int pf[3], int g, int ntot) {
    if (pf[2] <= 0) return (attn_pf){NULL, 0, 0, 0, 0};
    return attn_pf_init(block_row(j, pool, pf[0], pf[1], g), (size_t)pf[2] * j->kv->row_bytes, ntot);
}

/* The rows of kv head g in block `phys` (n of them, K and V) asked into L2
 * (prefetcht1), ATTN_FAR blocks before they are read. A sequence's blocks
 * lie anywhere in the pool, so the hardware prefetcher learns nothing
 * across them, and the next tile's prefetch into L1 (attn_pf) comes too
 * late to cover DRAM's latency on its own: a thread then reads scattered
 * 2 KiB runs at about half of what it streams. Asked per head as the
 * heads of a block are visited (not as one burst per block, which stalled
 * the core on its miss buffers), on the 110M shape's 32- and 64-sequence
 * decode step (tools/attn_ab.sh, 2 threads) the attention takes 0.73-0.81
 * of the time, on one sequence at 8K (SmolLM2's 3 kv heads) 0.66-0.71,
 * the same bits; 1 block ahead gave 0.80-0.91, 3 and 4 no more than 2.
 * With K/V in cache (sequences sharing their blocks) the extra
 * instructions cost 5-7%. */
static void far_prefetch(const attn_job *j, int phys, int g, int n) {
    const kv_pages *kv = j->kv;
    const size_t o0 = kv_pages_block_row_offset(kv, j->layer, phys, 0, g) & ~(size_t)63;
    const size_t o1 = kv_pages_block_row_offset(kv, j->layer, phys, n, g);
    for (size_t o = o0; o < o1; o += 64) {
        __builtin_prefetch(kv->k + o, 0, 2);
        __builtin_prefetch(kv->v + o, 0, 2);
    }
}

/* accum over a tile for rows [r0, r1) whose valid tile lengths nt[] do not
 * decrease: rows past their length take no more terms, so each row sees
 * exactly the additions it would see alone. The calls of the first rows
 * prefetch the span sp as they go. */
static void accum_rows(const attn_job *j, float *const *acc, const int *nt, int r0, int r1, const uint8_t *rows,
                       size_t stride, kv_cache_dtype d, const float *s, attn_pf *sp) {
    const int hd = j->kv->head_dim;
    for (int c = r0; c < r1; c += ATTN_HC) {
        const int ce = KV_MIN(r1, c + ATTN_HC);
        int done = 0;
        for (int k = c; k < ce; k++) {
            if (nt[k] <= done) continue;
            sp->t0 = done;
            j->kern->accum(acc + k, ce - k, hd, rows + (size_t)done * stride, stride, nt[k] - done, d,
                           s + (size_t)k * ATTN_TILE + done, ATTN_TILE, c == r0 ? sp : NULL);
            done = nt[k];
        }
    }
    attn_pf_upto(sp, sp->n);
}

/* Sliding window: the first `below` scores of a tile row lie before the
 * row's window. They become -inf (weight 0 after expsum); when the whole
 * row is below, it becomes zeros and 1 is returned: the caller then skips
 * the row's max and sum (an all -inf row would make them NaN), and the
 * zeros add nothing to its output. */
static int window_mask(float *sr, int nt, int below) {
    if (below >= nt) {
        for (int k = 0; k < nt; k++) sr[k] = 0.0f;
        return 1;
    }
    for (int k = 0; k < below; k++) sr[k] = -INFINITY;
    return 0;
}

/* Folds a chunk's softmax state (max m, sum l, accumulator acc) into a
 * row's merged state (*M, *L, ACC): the one combination both paths use (an
 * item folding its own chunks at their boundaries, and the merge after a
 * split), applied to a row's chunks in position order, so a row's bits do
 * not depend on which path ran it. An empty chunk (l == 0) changes
 * nothing; the first non-empty one is copied. Kept out of line: both
 * callers run the same instructions. */
__attribute__((noinline)) static void fold_chunk(float *M, float *L, float *ACC, float m, float l, const float *acc,
                                                 int hd) {
    if (l == 0.0f) return;
    if (*L == 0.0f) {
        memcpy(ACC, acc, (size_t)hd * sizeof(float));
        *M = m;
        *L = l;
        return;
    }
    const float mx = m > *M ? m : *M, a = expf(*M - mx), b = expf(m - mx);
    for (int i = 0; i < hd; i++) ACC[i] = ACC[i] * a + acc[i] * b;
    *L = *L * a + l * b;
    *M = mx;
}

/* A row's softmax state in one item: the current chunk's running max m,
 * sum l and accumulator ar (its output row, or its slot of the job's
 * partials), and the chunks before it folded into M, L and macc. */
typedef struct attn_rows {
    const float *qr[ATTN_ROWS];
    const int8_t *qq[ATTN_ROWS]; /* q8: the query rows quantized */
    float qd[ATTN_ROWS];
    int32_t qsum[ATTN_ROWS];
    float *ar[ATTN_ROWS];
    float m[ATTN_ROWS], l[ATTN_ROWS], M[ATTN_ROWS], L[ATTN_ROWS];
    int ctx[ATTN_ROWS], lo[ATTN_ROWS], ntr[ATTN_ROWS], rb[ATTN_ROWS + 1], ra[ATTN_ROWS];
    int nr;
} attn_rows;

/* Lays out an item's rows: grouped by kv head, then token, then query head,
 * so a kv head's rows have non-decreasing context lengths. */
static void rows_init(const attn_job *j, const attn_item *it, attn_rows *R, int8_t *qbuf) {
    const int hd = j->kv->head_dim, G = j->n_heads / j->kv->n_kv_heads;
    const int g0 = it->h0 / G, g1 = (it->h1 - 1) / G + 1;
    int nr = 0;
    for (int g = g0; g < g1; g++) {
        const int ha = KV_MAX(it->h0, g * G), hb = KV_MIN(it->h1, (g + 1) * G);
        R->rb[g - g0] = R->ra[g - g0] = nr;
        for (int t = it->tok; t < it->tok + it->ntok; t++)
            for (int h = ha; h < hb; h++) {
                const size_t o = ((size_t)t * j->n_heads + h) * hd;
                R->qr[nr] = j->q + o;
                if (j->q8) {
                    int8_t *qq = qbuf + (size_t)nr * (hd + 4);
                    attn_q8_query(R->qr[nr], hd, qq, &R->qd[nr], &R->qsum[nr], 1); /* q8: an AVX-512 table */
                    R->qq[nr] = qq;
                }
                R->ar[nr] = it->chunk < 0
                                ? j->out + o
                                : j->part + (((size_t)t * j->n_heads + h) * j->n_chunks + it->chunk) * (hd + 2);
                R->ctx[nr] = j->ab->pos[t] + 1;
                R->lo[nr] = j->window > 0 ? KV_MAX(0, R->ctx[nr] - j->window) : 0;
                R->m[nr] = R->M[nr] = -INFINITY;
                R->l[nr] = R->L[nr] = 0.0f;
                memset(R->ar[nr], 0, (size_t)hd * sizeof(float));
                nr++;
            }
    }
    R->rb[g1 - g0] = nr;
    R->nr = nr;
}

/* Chunk boundary of an item that takes the whole context: every row's
 * chunk state is folded into its merged state (macc: nr rows of head_dim)
 * and restarted. */
static void rows_fold(const attn_job *j, attn_rows *R, float *macc) {
    const int hd = j->kv->head_dim;
    for (int r = 0; r < R->nr; r++) {
        fold_chunk(&R->M[r], &R->L[r], macc + (size_t)r * hd, R->m[r], R->l[r], R->ar[r], hd);
        R->m[r] = -INFINITY;
        R->l[r] = 0.0f;
        memset(R->ar[r], 0, (size_t)hd * sizeof(float));
    }
}

/* One tile (nt context positions from P, block phys at t0) for the rows of
 * kv head g: scores, the online softmax step, the weighted sum of V. */
static void attend_tile(const attn_job *j, attn_rows *R, int gi, int g, int phys, int t0, int nt, int P,
                        const int pf[3], float *buf, float *s) {
    const kv_pages *kv = j->kv;
    const int hd = kv->head_dim, e = R->rb[gi + 1];
    int a = R->ra[gi];
    while (a < e && R->ctx[a] <= P) a++; /* rows whose context ended */
    R->ra[gi] = a;
    if (a == e) return;
    for (int r = a; r < e; r++) R->ntr[r] = KV_MIN(nt, R->ctx[r] - P);
    attn_pf sp = pf_span(j, kv->k, pf, g, R->ntr[e - 1]);
    size_t stride;
    kv_cache_dtype d;
    const uint8_t *rk = tile_rows(j, kv->k, phys, t0, R->ntr[e - 1], g, buf, &stride, &d);
    for (int r = a; r < e; r += ATTN_HC) {
        const int re = KV_MIN(e, r + ATTN_HC);
        attn_pf *p = r == a ? &sp : NULL; /* the first rows' call prefetches as it goes */
        if (j->q8)
            j->kern->scores_q8(R->qq + r, R->qd + r, R->qsum + r, re - r, hd, rk, stride, R->ntr[re - 1], j->scale,
                               s + (size_t)r * ATTN_TILE, ATTN_TILE, p);
        else
            j->kern->scores(R->qr + r, re - r, hd, rk, stride, R->ntr[re - 1], d, j->scale,
                            s + (size_t)r * ATTN_TILE, ATTN_TILE, p);
    }
    attn_pf_upto(&sp, sp.n);
    for (int r = a; r < e; r++) {
        float *sr = s + (size_t)r * ATTN_TILE;
        if (R->lo[r] > P && window_mask(sr, R->ntr[r], R->lo[r] - P)) continue;
        const float mx = j->kern->maxf(sr, R->ntr[r]);
        if (mx > R->m[r]) {
            if (R->l[r] > 0.0f) {
                const float corr = expf(R->m[r] - mx);
                R->l[r] *= corr;
                j->kern->scalev(R->ar[r], hd, corr);
            }
            R->m[r] = mx;
        }
        R->l[r] += j->kern->expsum(sr, R->ntr[r], R->m[r]);
    }
    const uint8_t *rv = tile_rows(j, kv->v, phys, t0, R->ntr[e - 1], g, buf, &stride, &d);
    sp = pf_span(j, kv->v, pf, g, R->ntr[e - 1]);
    accum_rows(j, R->ar, R->ntr, a, e, rv, stride, d, s, &sp);
}

/* One item: one pass over its context span with a running max and sum per
 * row; the accumulators are rescaled when the max grows. The context is
 * cut into chunks of j->split positions at fixed absolute positions, each
 * with its own softmax state: an item with chunk < 0 takes them all,
 * folding each into the row's merged state (macc) at its end, and divides
 * by the sum; an item with chunk k takes chunk k only and leaves its state
 * in the job's partials for kv_attn_merge. Each tile of context positions
 * is read for every kv head of the item before the next (a block holds the
 * heads' rows one after the other). */
static void attend(const attn_job *j, const attn_item *it, float *buf, float *macc) {
    const kv_pages *kv = j->kv;
    const int hd = kv->head_dim, bs = kv->block_size, G = j->n_heads / kv->n_kv_heads, tile = j->tile;
    const int g0 = it->h0 / G, g1 = (it->h1 - 1) / G + 1, S = j->split;
    const int32_t *table = j->ab->tables[j->ab->seq[it->tok]];
    float s[ATTN_ROWS * ATTN_TILE];
    int8_t qbuf[ATTN_MACC + 4 * ATTN_ROWS]; /* q8: rows x (hd codes + scale); rows x hd <= ATTN_MACC */
    attn_rows R;
    rows_init(j, it, &R, qbuf);
    /* the item's first token has the lowest window start: blocks wholly
     * before it are never read */
    int start = j->window > 0 ? KV_MAX(0, j->ab->pos[it->tok] + 1 - j->window) : 0;
    int end = j->ab->pos[it->tok + it->ntok - 1] + 1;
    if (it->chunk >= 0) {
        start = KV_MAX(start, it->chunk * S);
        end = KV_MIN(end, (it->chunk + 1) * S);
    }
    for (int blk = start / bs; blk * bs < end; blk++) {
        if (it->chunk < 0 && blk > start / bs && blk * bs % S == 0) rows_fold(j, &R, macc);
        const int phys = table[blk];
        const int nblk = KV_MIN(bs, end - blk * bs);
        for (int t0 = 0; t0 < nblk; t0 += tile) {
            const int nt = KV_MIN(tile, nblk - t0), P = blk * bs + t0; /* P: position of the tile's first row */
            /* the next tile, for prefetching: block, offset, length */
            int pf[3] = {phys, t0 + nt, KV_MIN(tile, nblk - t0 - nt)};
            if (pf[2] <= 0) {
                pf[0] = (blk + 1) * bs < end ? table[blk + 1] : -1;
                pf[1] = 0;
                pf[2] = pf[0] >= 0 ? KV_MIN(tile, KV_MIN(bs, end - (blk + 1) * bs)) : 0;
            }
            /* the block ATTN_FAR on, into L2 once per block, a head at a time */
            const int fb = blk + ATTN_FAR, fn = t0 == 0 && fb * bs < end ? KV_MIN(bs, end - fb * bs) : 0;
            for (int g = g0; g < g1; g++) {
                if (fn) far_prefetch(j, table[fb], g, fn);
                attend_tile(j, &R, g - g0, g, phys, t0, nt, P, pf, buf, s);
            }
        }
    }
    for (int r = 0; r < R.nr; r++) {
        if (it->chunk >= 0) {
            R.ar[r][hd] = R.m[r];
            R.ar[r][hd + 1] = R.l[r];
            continue;
        }
        if (R.L[r] != 0.0f) { /* more than one chunk: the last one folded in, the merged state out */
            fold_chunk(&R.M[r], &R.L[r], macc + (size_t)r * hd, R.m[r], R.l[r], R.ar[r], hd);
            memcpy(R.ar[r], macc + (size_t)r * hd, (size_t)hd * sizeof(float));
            R.l[r] = R.L[r];
        }
        j->kern->scalev(R.ar[r], hd, R.l[r] > 0.0f ? 1.0f / R.l[r] : 0.0f);
    }
}

/* After a split: each row's chunks folded in position order into its
 * output row, then divided by the sum, as attend does within an item. */
static void attn_merge(const attn_job *j) {
    const int hd = j->kv->head_dim, S = j->split;
    for (int t = 0; t < j->ab->n_tokens; t++) {
        const int ctx = j->ab->pos[t] + 1, lo = j->window > 0 ? KV_MAX(0, ctx - j->window) : 0;
        for (int h = 0; h < j->n_heads; h++) {
            const size_t row = (size_t)t * j->n_heads + h;
            float *o = j->out + row * hd, M = -INFINITY, L = 0.0f;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int k = lo / S; k <= (ctx - 1) / S; k++) {
                const float *p = j->part + (row * j->n_chunks + k) * (hd + 2);
                fold_chunk(&M, &L, o, p[hd], p[hd + 1], p, hd);
            }
            j->kern->scalev(o, hd, L > 0.0f ? 1.0f / L : 0.0f);
        }
    }
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    attn_job *j = ctx;
    float buf[ATTN_QBUF], macc[ATTN_MACC];
    for (;;) {
        const int k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (k >= j->n_items) break;
        attend(j, &j->items[k], buf, macc);
    }
}

/* Tokens from i on that one item may take, at most tmax: the following
 * tokens of the same sequence (one block table) whose positions do not
 * decrease, so the item's rows of a kv head have non-decreasing contexts. */
static int run_length(const kv_attn_batch *ab, int i, int tmax) {
    int n = 1;
    while (n < tmax && i + n < ab->n_tokens && ab->seq[i + n] == ab->seq[i] && ab->pos[i + n] >= ab->pos[i + n - 1])
        n++;
    return n;
}

/* How an item's token count and head range are chosen: at most ATTN_RUN
 * tokens and rmax rows; heads per item `hpi` (whole GQA groups when it
 * reaches one), fewer when the batch has few token groups, so that every
 * thread gets several items to take. */
typedef struct attn_plan {
    int tmax; /* tokens per item (at most) */
    int hpi;  /* query heads per item (at most; fewer when its tokens would exceed rmax rows) */
    int G;    /* query heads per kv head */
    int rmax; /* rows per item: ATTN_ROWS, fewer when their merged accumulators would not fit ATTN_MACC */
} attn_plan;

/* Heads per item for an item of nt tokens. */
static int plan_heads(const attn_plan *pl, int nt) {
    int h = KV_MIN(pl->hpi, pl->rmax / nt);
    if (h >= pl->G) h = h / pl->G * pl->G;
    return KV_MAX(h, 1);
}

/* Fills items from the cursor (*tok, *head) on, at most cap; returns the count. */
static int plan_items(const kv_attn_batch *ab, int n_heads, const attn_plan *pl, attn_item *it, int cap, int *tok,
                      int *head) {
    int n = 0;
    while (n < cap && *tok < ab->n_tokens) {
        const int nt = run_length(ab, *tok, pl->tmax), hpi = plan_heads(pl, nt);
        it[n++] = (attn_item){*tok, nt, *head, KV_MIN(n_heads, *head + hpi), -1};
        *head += hpi;
        if (*head >= n_heads) {
            *head = 0;
            *tok += nt;
        }
    }
    return n;
}

/* The split of a long context across threads: each of the n items becomes
 * one item per chunk its span touches, written into out (at most cap).
 * Returns the count, or 0 when they would not fit. */
static int split_items(const attn_job *j, const attn_item *base, int n, attn_item *out, int cap) {
    const int S = j->split;
    int m = 0;
    for (int i = 0; i < n; i++) {
        const attn_item *b = &base[i];
        const int ctx = j->ab->pos[b->tok + b->ntok - 1] + 1;
        const int lo = j->window > 0 ? KV_MAX(0, j->ab->pos[b->tok] + 1 - j->window) : 0;
        for (int k = lo / S; k <= (ctx - 1) / S; k++) {
            if (m == cap) return 0;
            out[m] = *b;
            out[m++].chunk = k;
        }
    }
    return m;
}

void kv_attn_run(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                 const float *q, float *out, int n_heads, float scale) {
    kv_attn_run_split(pool, isa, kv, layer, ab, q, out, n_heads, scale, 0, NULL, 0);
}

void kv_attn_run_window(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                        const float *q, float *out, int n_heads, float scale, int window) {
    kv_attn_run_split(pool, isa, kv, layer, ab, q, out, n_heads, scale, window, NULL, 0);
}

size_t kv_attn_split_floats(const kv_pages *kv, int n_tokens, int n_heads, int max_context) {
    if (!kv || kv->block_size <= 0 || kv->head_dim <= 0 || n_tokens <= 0 || n_heads <= 0 || max_context <= 0) return 0;
    const int S = (ATTN_SPLIT + kv->block_size - 1) / kv->block_size * kv->block_size;
    return (size_t)n_tokens * n_heads * (size_t)((max_context - 1) / S + 1) * (size_t)(kv->head_dim + 2);
}

int kv_attn_run_split(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                      const float *q, float *out, int n_heads, float scale, int window, float *part,
                      size_t part_floats) {
    if (!kv || !ab || ab->n_tokens <= 0 || n_heads <= 0 || kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads ||
        kv->head_dim <= 0 || kv->head_dim > KV_ATTN_MAX_HEAD_DIM || layer < 0 || layer >= kv->n_layers)
        return 0;
    attn_job j = {
        .kern = kernels_for(isa),
        .kv = kv,
        .layer = layer,
        .ab = ab,
        .q = q,
        .out = out,
        .n_heads = n_heads,
        .scale = scale,
        .window = window,
        .tile = KV_MAX(1, KV_MIN(ATTN_TILE, ATTN_QBUF / kv->head_dim)),
        .split = (ATTN_SPLIT + kv->block_size - 1) / kv->block_size * kv->block_size,
    };
    j.q8 = kv->dtype == KV_CACHE_INT8 && j.kern->scores_q8 != NULL;
    int64_t total = 0; /* context length x heads */
    int ctx_max = 0;
    for (int i = 0; i < ab->n_tokens; i++) {
        total += (window > 0 ? KV_MIN((int64_t)ab->pos[i] + 1, window) : (int64_t)ab->pos[i] + 1) * n_heads;
        ctx_max = KV_MAX(ctx_max, ab->pos[i] + 1);
    }
    /* A small job is not worth waking the pool for: little arithmetic and
     * little K/V to stream (a single decode token of a 100M model streams
     * hundreds of KiB per layer, which two threads read faster). */
    const int64_t kv_bytes = total / (n_heads / kv->n_kv_heads) * 2 * (int64_t)kv->row_bytes;
    if (total < 4096 && kv_bytes < 65536) pool = NULL;
    const int nth = kv_threadpool_size(pool);
    attn_plan pl = {.G = n_heads / kv->n_kv_heads, .rmax = KV_MIN(ATTN_ROWS, ATTN_MACC / kv->head_dim)};
    pl.tmax = KV_MAX(1, KV_MIN(ATTN_RUN, pl.rmax / pl.G));
    int groups = 0; /* token groups (items if each took every head) */
    for (int i = 0; i < ab->n_tokens; i += run_length(ab, i, pl.tmax)) groups++;
    /* NOTE: 8 items per thread balance well with items taken from a
     * counter; a larger head range per item reads longer contiguous runs. */
    pl.hpi = (int)KV_MAX(1, KV_MIN((int64_t)n_heads, (int64_t)n_heads * groups / (8 * nth)));
    /* Few items for the threads and long contexts: each item's context is
     * split into its chunks, one item each (flash-decoding), their states
     * merged after. The chunks are the ones every path folds (fixed
     * positions), so this changes the schedule only, as do the GQA groups. */
    const int64_t split_need = (int64_t)kv_attn_split_floats(kv, ab->n_tokens, n_heads, ctx_max);
    const int split = nth > 1 && ctx_max > j.split && part && split_need <= (int64_t)part_floats &&
                      (int64_t)kv->n_kv_heads * groups < 8 * nth;
    /* Whole GQA groups once there is an item per thread: an item then reads
     * and widens each K/V element once for all G query heads of its kv
     * head, instead of G items each reading it (a long-context decode
     * token of SmolLM2, G = 3, did three times the loads and conversions).
     * Only the schedule changes: a row's operations are the same in any item. */
    if ((int64_t)kv->n_kv_heads * groups >= nth || split) pl.hpi = KV_MAX(pl.hpi, pl.G);
    attn_item items[ATTN_ITEMS];
    j.items = items;
    int tok = 0, head = 0;
    if (split) {
        attn_item base[ATTN_ITEMS / 4];
        const int nb = plan_items(ab, n_heads, &pl, base, ATTN_ITEMS / 4, &tok, &head);
        j.n_items = tok >= ab->n_tokens ? split_items(&j, base, nb, items, ATTN_ITEMS) : 0;
        if (j.n_items > 0) {
            j.part = part;
            j.n_chunks = (ctx_max - 1) / j.split + 1;
            atomic_store_explicit(&j.next, 0, memory_order_relaxed);
            kv_threadpool_run(pool, attn_task, &j);
            attn_merge(&j);
            return 1;
        }
        tok = head = 0; /* too many items: the whole-context items below */
    }
    while (tok < ab->n_tokens) {
        j.n_items = plan_items(ab, n_heads, &pl, items, ATTN_ITEMS, &tok, &head);
        atomic_store_explicit(&j.next, 0, memory_order_relaxed);
        kv_threadpool_run(pool, attn_task, &j);
    }
    return 0;
}

int kv_attn_int8_integer(kv_cpu_isa isa) { return kernels_for(isa)->scores_q8 != NULL; }

int kv_attn_scores_q8(kv_cpu_isa isa, const float *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                      float scale, float *s) {
    const kv_attn_kernels *k = kernels_for(isa);
    void (*f)(const int8_t *const *, const float *, const int32_t *, int, int, const uint8_t *, size_t, int, float,
              float *, int, attn_pf *) = isa == KV_CPU_ISA_SCALAR ? scores_q8_scalar : k->scores_q8;
    if (!f || hd <= 0 || hd > KV_ATTN_MAX_HEAD_DIM || nr < 0 || nt < 0) return -1;
    int8_t qb[ATTN_HC][KV_ATTN_MAX_HEAD_DIM + 4];
    const int8_t *qq[ATTN_HC];
    float qd[ATTN_HC];
    int32_t qs[ATTN_HC];
    for (int r = 0; r < nr; r += ATTN_HC) {
        const int n = KV_MIN(ATTN_HC, nr - r);
        for (int h = 0; h < n; h++) {
            attn_q8_query(q + (size_t)(r + h) * hd, hd, qb[h], &qd[h], &qs[h], isa != KV_CPU_ISA_SCALAR);
            qq[h] = qb[h];
        }
        if (nt > 0) f(qq, qd, qs, n, hd, rows, stride, nt, scale, s + (size_t)r * nt, nt, NULL);
    }
    return 0;
}

/* ---- store ---- */

typedef struct store_job {
    kv_cpu_isa isa;
    kv_pages *kv;
    int layer;
    const kv_attn_batch *ab;
    const float *k, *v; /* (n_tokens, n_kv_heads, head_dim) */
} store_job;

static void encode_row(kv_cpu_isa isa, kv_cache_dtype d, const float *src, uint8_t *dst, int hd) {
#ifdef KV_HAVE_X86_KERNELS
    if (d == KV_CACHE_F16 && isa >= KV_CPU_ISA_AVX2) {
        kv_attn_f16_encode_avx2(src, dst, hd);
        return;
    }
    if (d == KV_CACHE_INT8 && isa >= KV_CPU_ISA_AVX2) {
        kv_attn_int8_encode_avx2(src, dst, hd);
        return;
    }
    if ((d == KV_CACHE_FP8_E4M3 || d == KV_CACHE_FP8_E5M2) && isa >= KV_CPU_ISA_AVX2) {
        kv_attn_fp8_encode_avx2(src, dst, hd, d == KV_CACHE_FP8_E4M3);
        return;
    }
#endif
    (void)isa;
    kv_dtype_encode_row(d, src, dst, hd);
}

static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    kv_pages *kv = j->kv;
    const int n = j->ab->n_tokens, nkv = kv->n_kv_heads, hd = kv->head_dim;
    const int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
    const int i0 = (int)((int64_t)n * ith / nth), i1 = (int)((int64_t)n * (ith + 1) / nth);
    for (int i = i0; i < i1; i++) {
        const int32_t slot = j->ab->slot[i];
        if (slot < 0 || slot >= n_slots) continue; /* the forward rejects these; never write out of the pool */
        for (int g = 0; g < nkv; g++) {
            size_t src = ((size_t)i * nkv + g) * hd, off = kv_pages_row_offset(kv, j->layer, slot, g);
            encode_row(j->isa, kv->dtype, j->k + src, kv->k + off, hd);
            encode_row(j->isa, kv->dtype, j->v + src, kv->v + off, hd);
        }
    }
}

void kv_attn_store(kv_threadpool *pool, kv_cpu_isa isa, kv_pages *kv, int layer, const kv_attn_batch *ab,
                   const float *k, const float *v) {
    if (!kv || !ab || ab->n_tokens <= 0 || layer < 0 || layer >= kv->n_layers) return;
    isa = kv_cpu_isa_usable(isa);
    store_job j = {isa, kv, layer, ab, k, v};
    /* Encoding is cheap next to the matmuls; only big prefill chunks of
     * quantized rows are worth the pool. */
    if ((int64_t)ab->n_tokens * kv->n_kv_heads * kv->head_dim < 65536) pool = NULL;
    kv_threadpool_run(pool, store_task, &j);
}

/* ---- blocks ---- */

void kv_attn_copy_block(kv_pages *kv, int dst, int src) {
    if (!kv || dst == src || dst < 0 || src < 0 || dst >= kv->n_blocks || src >= kv->n_blocks) return;
    const size_t bb = (size_t)kv->block_size * kv->slot_bytes;
    for (int l = 0; l < kv->n_layers; l++) {
        size_t base = (size_t)l * kv->layer_bytes;
        memcpy(kv->k + base + (size_t)dst * bb, kv->k + base + (size_t)src * bb, bb);
        memcpy(kv->v + base + (size_t)dst * bb, kv->v + base + (size_t)src * bb, bb);
    }
}

/* ---- validation ---- */

int kv_attn_batch_check(const kv_pages *kv, const kv_attn_batch *ab, int n_heads, kv_err *err) {
    if (!kv || !ab) return kv_err_set(err, KV_ERR_INVAL, "attention: no pages or batch");
    if (kv->head_dim <= 0 || kv->head_dim > KV_ATTN_MAX_HEAD_DIM)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "attention: head_dim %d out of range [1, %d]", kv->head_dim,
                          KV_ATTN_MAX_HEAD_DIM);
    if (kv->n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv->n_kv_heads)
        return kv_err_set(err, KV_ERR_INVAL, "attention: %d query heads is not a multiple of %d kv heads", n_heads,
                          kv->n_kv_heads);
    if (ab->n_tokens < 0 || ab->n_seqs < 0 || (ab->n_tokens > 0 && (!ab->pos || !ab->seq || !ab->slot)))
        return kv_err_set(err, KV_ERR_INVAL, "attention: malformed batch (%d tokens, %d sequences)", ab->n_tokens,
                          ab->n_seqs);
    const int bs = kv->block_size;
    for (int i = 0; i < ab->n_tokens; i++) {
        const int s = ab->seq[i], p = ab->pos[i];
        if (s < 0 || s >= ab->n_seqs || !ab->tables || !ab->tables[s])
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d has sequence %d of %d", i, s, ab->n_seqs);
        if (p < 0 || p > INT32_MAX - bs)
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d has position %d", i, p);
        const int32_t *t = ab->tables[s];
        for (int blk = 0; blk <= p / bs; blk++)
            if (t[blk] < 0 || t[blk] >= kv->n_blocks)
                return kv_err_set(err, KV_ERR_RANGE, "attention: sequence %d block %d maps to %d (pool of %d)", s,
                                  blk, t[blk], kv->n_blocks);
        const int64_t want = (int64_t)t[p / bs] * bs + p % bs;
        if (ab->slot[i] != want)
            return kv_err_set(err, KV_ERR_RANGE, "attention: token %d slot %d, its table says %lld", i, ab->slot[i],
                              (long long)want);
    }
    return 0;
}
