/* test_attention_pf.c - the attention kernels' prefetch schedule (attn_pf,
 * kernels/cpu_attention_isa.h): a span of the next tile's bytes asked for a
 * line at a time as a kernel call goes through its keys. On random spans
 * (any alignment, 1 byte to 40 KB: up to 32 rows of head_dim 256 in f32),
 * tiles of 1-32 keys cut into calls at random key offsets, stepped every
 * key (the scalar kernels) or every 4 (the SIMD ones): the bytes asked for
 * never decrease, are whole lines, stay within one line of the share due
 * after each key (n * keys done / tile keys), never go past the span's last
 * line, and the span is covered after the closing attn_pf_upto. */
#include <stdint.h>
#include <stdio.h>

#include "../harness.h"
#include "../../kernels/cpu_attention_isa.h"

static int rnd(int n) { return (int)(harness_rand64() % (uint64_t)n); }

static void test_pf_schedule(void) {
    _Alignas(64) static uint8_t pool[64 * 1024 + 128];
    int bad = 0;
    for (int rep = 0; rep < 4000 && !bad; rep++) {
        const size_t bytes = rep == 0 ? 40960 : 1 + (size_t)rnd(40960);
        const int ntot = 1 + rnd(32), every = rnd(2) ? 1 : 4, off = rnd(64);
        attn_pf pf = attn_pf_init(pool + off, bytes, ntot);
        CHECK(pf.p == pool && pf.n == bytes + (size_t)off); /* pool is 64-aligned */
        size_t last = 0;
        for (int t0 = 0; t0 < ntot && !bad;) {
            const int nt = 1 + rnd(ntot - t0); /* one kernel call: keys [t0, t0 + nt) */
            pf.t0 = t0;
            for (int t = 0; t < nt; t += every) {
                attn_pf_step(&pf, t);
                const size_t due = (size_t)((uint64_t)pf.n * (uint64_t)(t0 + t) / (uint64_t)ntot);
                if (pf.done < last || pf.done % 64 || pf.done + 64 < due || pf.done > due + 64 ||
                    (pf.done > 0 && pf.done - 64 >= pf.n)) {
                    CHECKF(0, "rep %d: span %zu, tile %d, key %d: asked %zu, due %zu", rep, pf.n, ntot, t0 + t,
                           pf.done, due);
                    bad = 1;
                    break;
                }
                last = pf.done;
            }
            t0 += nt;
        }
        attn_pf_upto(&pf, pf.n);
        CHECKF(pf.done >= pf.n && pf.done < pf.n + 64, "rep %d: span %zu covered to %zu", rep, pf.n, pf.done);
    }
    attn_pf_step(NULL, 3); /* nothing to prefetch: a no-op */
}

TEST_MAIN(T(test_pf_schedule))
