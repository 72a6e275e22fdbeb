/* attn_bench.c - one decode token's attention over a long context (the
 * SmolLM2 shape: 9 query heads over 3 kv heads of 64, blocks of 16), timed
 * with the context split across the threads (kv_attn_run_split with its
 * buffer) and unsplit (no buffer: the same bits, one work item per kv head),
 * alternating in one process so that a loaded machine's drift lands on
 * both; also the memory read bandwidth measured in the same run. Prints
 * per dtype and depth the median ms per layer of each and the GB/s of K/V
 * they stream.
 *
 * --batch N: instead, one decode token of each of N sequences (the
 * 64-concurrent step of the 110M shape: 12 query heads over 12 kv heads of
 * 64, blocks of 16, contexts spread evenly over --ctx LO:HI, every block of
 * the pool scattered), timed per layer over 12 layers whose K/V exceed the
 * last-level cache; prints the median ms per layer and the GB/s of K/V read.
 *
 *   build/tools/attn_bench [--depth N]... [--dtype f16|int8|...]... [--reps N] [--threads N]
 *   build/tools/attn_bench --batch 64 [--ctx 128:256] [--heads 12 --kv-heads 12] [--dtype D]... [--reps N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/cpu_attention.h"
#include "../kernels/kv_dtype.h"
#include "../kernels/membw.h"
#include "../kernels/threadpool.h"
#include "attn_batch.h"

enum { NH = 9, NKV = 3, HD = 64, BS = 16, LAYERS = 8 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times depth-token decode attention of dtype d; prints one line. */
static void bench(kv_threadpool *pool, kv_cache_dtype d, int depth, int reps) {
    const int nb = (depth + BS - 1) / BS;
    kv_pages pg = {.dtype = d, .n_layers = LAYERS, .n_kv_heads = NKV, .head_dim = HD, .block_size = BS, .n_blocks = nb};
    kv_pages_set_sizes(&pg);
    pg.k = malloc(pg.layer_bytes * LAYERS);
    pg.v = malloc(pg.layer_bytes * LAYERS);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    float *row = malloc(sizeof(float) * HD), q[NH * HD], out[NH * HD];
    size_t part_n = kv_attn_split_floats(&pg, 1, NH, depth);
    float *part = malloc(sizeof(float) * part_n);
    if (!pg.k || !pg.v || !table || !row || !part) {
        fprintf(stderr, "attn_bench: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < nb; i++) table[i] = (int32_t)((i * 7919L) % nb); /* scattered blocks */
    srand(1);
    for (size_t r = 0; r < (size_t)nb * BS * NKV * LAYERS; r++) {
        for (int e = 0; e < HD; e++) row[e] = (float)rand() / RAND_MAX - 0.5f;
        kv_dtype_encode_row(d, row, pg.k + r * pg.row_bytes, HD);
        kv_dtype_encode_row(d, row, pg.v + r * pg.row_bytes, HD);
    }
    for (int e = 0; e < NH * HD; e++) q[e] = (float)rand() / RAND_MAX - 0.5f;
    int32_t pos = depth - 1, seq = 0, slot = table[pos / BS] * BS + pos % BS;
    const int32_t *tabs[1] = {table};
    kv_attn_batch ab = {.n_tokens = 1, .pos = &pos, .seq = &seq, .slot = &slot, .n_seqs = 1, .tables = tabs};
    double *ts = malloc(sizeof(double) * (size_t)reps), *tu = malloc(sizeof(double) * (size_t)reps);
    const kv_cpu_isa isa = kv_cpu_isa_best();
    int split_runs = 0; /* calls that did split (kv_attn_run_split's answer) */
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up; odd r runs the unsplit path first (no order bias) */
        double t[2];
        for (int k = 0; k < 2; k++) {
            const int split = (k == 0) == (r % 2 == 0);
            const double t0 = now_s();
            for (int l = 0; l < LAYERS; l++)
                split_runs += kv_attn_run_split(pool, isa, &pg, l, &ab, q, out, NH, 0.125f, 0, split ? part : NULL,
                                                split ? part_n : 0);
            t[!split] = (now_s() - t0) / LAYERS;
        }
        if (r >= 0) {
            ts[r] = t[0];
            tu[r] = t[1];
        }
    }
    const double ms = median(ts, reps) * 1e3, mu = median(tu, reps) * 1e3;
    const double bytes = 2.0 * depth * NKV * (double)pg.row_bytes; /* K and V of one layer */
    printf("  %-9s depth %6d: split %7.3f ms/layer (%5.1f GB/s), unsplit %7.3f ms/layer (%5.1f GB/s), unsplit/split "
           "%.2f%s\n",
           kv_cache_dtype_name(d), depth, ms, bytes / ms * 1e-6, mu, bytes / mu * 1e-6, mu / ms,
           split_runs == (reps + 1) * LAYERS ? "" : " (the split did not run: one chunk, or one thread)");
    free(ts);
    free(tu);
    free(part);
    free(row);
    free(table);
    free(pg.k);
    free(pg.v);
}

/* Times one decode token of each of b->n_seqs sequences (dtype b->dtype); prints one line. */
static void bench_batch(kv_threadpool *pool, const attn_batch_shape *b, int reps) {
    attn_batch_data o;
    float *out = malloc(sizeof(float) * (size_t)b->n_seqs * b->n_heads * HD);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!out || !t || attn_batch_make(b, &o) != 0) {
        fprintf(stderr, "attn_bench: out of memory\n");
        exit(1);
    }
    const kv_cpu_isa isa = kv_cpu_isa_best();
    for (int r = -1; r < reps; r++) {
        const double t0 = now_s();
        for (int l = 0; l < b->layers; l++) kv_attn_run(pool, isa, &o.pg, l, &o.ab, o.q, out, b->n_heads, 0.125f);
        if (r >= 0) t[r] = (now_s() - t0) / b->layers;
    }
    const double ms = median(t, reps) * 1e3, bytes = 2.0 * o.keys * b->n_kv_heads * (double)o.pg.row_bytes;
    printf("  %-9s %d sequences, contexts %d-%d: %7.3f ms/layer, %5.1f GB/s of K/V, %.1f ns per key and kv head "
           "(thread time)\n",
           kv_cache_dtype_name(b->dtype), b->n_seqs, b->ctx_lo, b->ctx_hi, ms, bytes / ms * 1e-6,
           ms * 1e6 * kv_threadpool_size(pool) / (o.keys * b->n_kv_heads));
    attn_batch_free(&o);
    free(t);
    free(out);
}

int main(int argc, char **argv) {
    int depths[16], nd = 0, reps = 21, threads = 2, ndt = 0;
    attn_batch_shape bs = {.ctx_lo = 128, .ctx_hi = 256, .n_heads = 12, .n_kv_heads = 12, .head_dim = HD,
                           .block_size = BS, .layers = 12};
    kv_cache_dtype dts[KV_CACHE_DTYPE_COUNT];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--depth") && i + 1 < argc && nd < 16) {
            depths[nd++] = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc && ndt < KV_CACHE_DTYPE_COUNT) {
            if (kv_cache_dtype_from_name(argv[++i], &dts[ndt]) != 0) {
                fprintf(stderr, "attn_bench: unknown dtype %s\n", argv[i]);
                return 2;
            }
            ndt++;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            bs.n_seqs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d:%d", &bs.ctx_lo, &bs.ctx_hi) != 2) bs.ctx_lo = 0;
        } else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            bs.n_heads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) {
            bs.n_kv_heads = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: attn_bench [--depth N]... [--dtype NAME]... [--reps N] [--threads N]\n"
                            "       attn_bench --batch N [--ctx LO:HI] [--heads H --kv-heads K] [--dtype NAME]...\n");
            return 2;
        }
    }
    if (!nd) {
        depths[0] = 2048;
        depths[1] = 8192;
        nd = 2;
    }
    if (!ndt) {
        dts[0] = KV_CACHE_F16;
        dts[1] = KV_CACHE_INT8;
        dts[2] = KV_CACHE_FP8_E4M3;
        ndt = 3;
    }
    if (reps < 1 || threads < 1) return 2;
    if (bs.n_seqs < 0 || (bs.n_seqs > 0 && (bs.ctx_lo < 1 || bs.ctx_hi < bs.ctx_lo || bs.n_kv_heads < 1 ||
                                            bs.n_heads < 1 || bs.n_heads % bs.n_kv_heads))) {
        fprintf(stderr, "attn_bench: bad --batch shape (contexts 1 <= LO <= HI, heads a multiple of kv heads)\n");
        return 2;
    }
    kv_threadpool *pool = kv_threadpool_new(threads);
    if (!pool) return 1;
    if (bs.n_seqs > 0) {
        printf("attention of one decode token of %d sequences, %d heads over %d of %d, %d threads, isa %s, median of "
               "%d\n",
               bs.n_seqs, bs.n_heads, bs.n_kv_heads, HD, kv_threadpool_size(pool), kv_cpu_isa_name(kv_cpu_isa_best()),
               reps);
        printf("  memory read bandwidth: %.1f GB/s (%d threads)\n", kv_membw_measure_gbs(pool, 0, 3),
               kv_threadpool_size(pool));
        for (int t = 0; t < (ndt ? ndt : 1); t++) {
            bs.dtype = ndt ? dts[t] : KV_CACHE_F16;
            bench_batch(pool, &bs, reps);
        }
        printf("  memory read bandwidth: %.1f GB/s (after)\n", kv_membw_measure_gbs(pool, 0, 3));
        kv_threadpool_free(pool);
        return 0;
    }
    printf("attention of one decode token, %d heads over %d of %d, %d threads, isa %s, median of %d\n", NH, NKV, HD,
           kv_threadpool_size(pool), kv_cpu_isa_name(kv_cpu_isa_best()), reps);
    printf("  memory read bandwidth: %.1f GB/s (%d threads)\n", kv_membw_measure_gbs(pool, 0, 3),
           kv_threadpool_size(pool));
    for (int t = 0; t < ndt; t++)
        for (int i = 0; i < nd; i++)
            if (depths[i] > 0) bench(pool, dts[t], depths[i], reps);
    printf("  memory read bandwidth: %.1f GB/s (after)\n", kv_membw_measure_gbs(pool, 0, 3));
    kv_threadpool_free(pool);
    return 0;
}
