/* attn_ab.c - the paged attention of two builds timed in one process,
 * alternating (which one runs first alternates too), so that a loaded
 * machine's drift lands on both: one decode token of each of N sequences
 * (the 64-concurrent step of the 110M shape by default: 12 query heads over
 * 12 kv heads of 64, f16, blocks of 16 scattered over the pool, contexts
 * spread evenly over LO..HI, 12 layers whose K/V exceed the last-level
 * cache). "base" is an older revision's kernels/cpu_attention.c and its
 * ISA files compiled with their symbols renamed base_* (tools/attn_ab.sh
 * builds it); "new" is the working tree's libkvkernels.a. Also a
 * read-only sweep of the same blocks in the same order (the ceiling of
 * this access pattern on one thread) and the memory read bandwidth, both
 * in the same run. Prints the
 * medians, the paired new/base median and the outputs' relative difference
 * (0 when the change keeps the bits).
 *
 *   tools/attn_ab.sh REV [--batch N] [--ctx LO:HI] [--heads H --kv-heads K] [--dtype D]
 *                        [--threads T] [--reps R] [--shared]
 * --shared: every sequence reads the same blocks (K/V in cache: the
 * arithmetic alone). KVTOP_CPU_ISA=avx2 (or scalar) caps the kernel level
 * as it does for the cpu backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_attention.h"
#include "kv_dtype.h"
#include "membw.h"
#include "threadpool.h"
#include "../attn_batch.h"

void base_kv_attn_run(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                      const float *q, float *out, int n_heads, float scale);

enum { HD = 64, BS = 16, L = 12 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double med(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static volatile uint64_t sink;

/* Reads every K/V byte the attention reads, in its order (per sequence, per
 * block: K then V), summing 64-bit words. */
static void read_sweep(const kv_pages *pg, const kv_attn_batch *ab) {
    uint64_t a = 0, b = 0;
    const size_t bb = (size_t)pg->n_kv_heads * BS * pg->row_bytes;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < ab->n_tokens; s++)
            for (int blk = 0; blk <= ab->pos[s] / BS; blk++) {
                const size_t o = (size_t)l * pg->layer_bytes + (size_t)ab->tables[s][blk] * bb;
                const uint64_t *k = (const uint64_t *)(const void *)(pg->k + o),
                               *v = (const uint64_t *)(const void *)(pg->v + o);
                for (size_t i = 0; i < bb / 8; i += 2) {
                    a += k[i];
                    b += k[i + 1];
                }
                for (size_t i = 0; i < bb / 8; i += 2) {
                    a += v[i];
                    b += v[i + 1];
                }
            }
    sink = a + b;
}

int main(int argc, char **argv) {
    int ns = 64, lo = 128, hi = 256, nh = 12, nkv = 12, reps = 15, threads = 1, shared = 0;
    kv_cache_dtype d = KV_CACHE_F16;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--batch")) ns = atoi(v), i++;
        else if (!strcmp(argv[i], "--ctx")) {
            if (sscanf(v, "%d:%d", &lo, &hi) != 2) lo = 0;
            i++;
        } else if (!strcmp(argv[i], "--heads")) nh = atoi(v), i++;
        else if (!strcmp(argv[i], "--kv-heads")) nkv = atoi(v), i++;
        else if (!strcmp(argv[i], "--reps")) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads")) threads = atoi(v), i++;
        else if (!strcmp(argv[i], "--dtype")) {
            if (kv_cache_dtype_from_name(v, &d) != 0) lo = 0;
            i++;
        } else if (!strcmp(argv[i], "--shared")) shared = 1;
        else lo = 0;
    }
    if (ns < 1 || lo < 1 || hi < lo || nkv < 1 || nh < 1 || nh % nkv || reps < 1 || threads < 1) {
        fprintf(stderr, "attn_ab: bad arguments (see the file's header)\n");
        return 2;
    }
    const attn_batch_shape sh = {ns, lo, hi, nh, nkv, HD, BS, L, shared, d};
    attn_batch_data o;
    float *o1 = malloc(sizeof(float) * (size_t)ns * nh * HD), *o2 = malloc(sizeof(float) * (size_t)ns * nh * HD);
    double *ta = malloc(sizeof(double) * 4 * (size_t)reps);
    if (!o1 || !o2 || !ta || attn_batch_make(&sh, &o) != 0) {
        fprintf(stderr, "attn_ab: out of memory\n");
        return 1;
    }
    double *tb = ta + reps, *pr = tb + reps, *tr = pr + reps;
    const kv_pages pg = o.pg;
    const kv_attn_batch ab = o.ab;
    const size_t qn = o.qn;
    kv_threadpool *pool = kv_threadpool_new(threads);
    if (!pool) return 1;
    kv_cpu_isa isa = kv_cpu_isa_best(), want;
    const char *env = getenv("KVTOP_CPU_ISA"); /* a cap, as the cpu backend takes it */
    if (env && *env && kv_cpu_isa_from_name(env, &want) == 0 && want < isa) isa = want;
    printf("%d sequences, contexts %d-%d, %d heads over %d of %d, %s, %d threads, isa %s%s; median of %d\n", ns, lo,
           hi, nh, nkv, HD, kv_cache_dtype_name(d), kv_threadpool_size(pool), kv_cpu_isa_name(isa),
           shared ? ", shared blocks (in cache)" : "", reps);
    printf("  memory read bandwidth: %.1f GB/s\n", kv_membw_measure_gbs(pool, 0, 3));
    for (int r = -1; r < reps; r++) {
        double t[2];
        for (int k = 0; k < 2; k++) {
            const int which = (k + (r & 1)) & 1;
            const double t0 = now_s();
            for (int l = 0; l < L; l++)
                (which ? kv_attn_run : base_kv_attn_run)(pool, isa, &pg, l, &ab, o.q, which ? o2 : o1, nh, 0.125f);
            t[which] = (now_s() - t0) / L;
        }
        const double t0 = now_s();
        read_sweep(&pg, &ab);
        if (r >= 0) {
            ta[r] = t[0];
            tb[r] = t[1];
            pr[r] = t[1] / t[0];
            tr[r] = (now_s() - t0) / L;
        }
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < qn; i++) {
        const double x = (double)o2[i] - o1[i];
        num += x * x;
        den += (double)o1[i] * o1[i];
    }
    const double a = med(ta, reps), b = med(tb, reps), p = med(pr, reps), rs = med(tr, reps);
    const double bytes = 2.0 * o.keys * nkv * (double)pg.row_bytes; /* K and V of one layer */
    printf("  base %.3f ms/layer (%.1f GB/s of K/V), new %.3f ms/layer (%.1f GB/s); paired new/base median %.3f\n",
           a * 1e3, bytes / a * 1e-9, b * 1e3, bytes / b * 1e-9, p);
    printf("  read-only sweep of the same blocks, 1 thread: %.3f ms/layer (%.1f GB/s); outputs' relative difference "
           "%.2e\n",
           rs * 1e3, bytes / rs * 1e-9, den > 0 ? __builtin_sqrt(num / den) : 0.0);
    printf("  memory read bandwidth: %.1f GB/s (after)\n", kv_membw_measure_gbs(pool, 0, 3));
    kv_threadpool_free(pool);
    attn_batch_free(&o);
    free(o1);
    free(o2);
    free(ta);
    return 0;
}
