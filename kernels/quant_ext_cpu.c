/* quant_ext_cpu.c - which of quant_ext's SIMD levels this CPU runs: cpuid
 * plus the OS's consent to save the vector state (quant_ext.c picks the
 * kernels from it). */
#include "quant_ext.h"
#include "quant_ext_isa.h"

#ifdef KV_QEXT_HAVE_X86
#include <cpuid.h>

/* CPU features from cpuid, plus the OS's consent (XCR0) to save the AVX
 * and AVX-512 register state: a CPU flag alone is not enough. */
static int x86_level(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !fma || !f16c) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6) return 0; /* SSE + AVX state */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((b >> 5) & 1)) return 0; /* AVX2 */
    const int f512 = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    if (f512 && bw && vl && vnni && (xlo & 0xE6) == 0xE6) return 2; /* + opmask, zmm state */
    return 1;
}
#endif

int kv_qext_isa_available(kv_qext_isa isa) {
    if (isa == KV_QEXT_ISA_SCALAR) return 1;
#ifdef KV_QEXT_HAVE_X86
    static int cached = -1; /* every thread computes the same value; atomics keep it race-free */
    int level = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (level < 0) {
        level = x86_level();
        __atomic_store_n(&cached, level, __ATOMIC_RELAXED);
    }
    return (isa == KV_QEXT_ISA_AVX2 || isa == KV_QEXT_ISA_AVX512) && (int)isa <= level;
#else
    return 0;
#endif
}

kv_qext_isa kv_qext_isa_best(void) {
    if (kv_qext_isa_available(KV_QEXT_ISA_AVX512)) return KV_QEXT_ISA_AVX512;
    if (kv_qext_isa_available(KV_QEXT_ISA_AVX2)) return KV_QEXT_ISA_AVX2;
    return KV_QEXT_ISA_SCALAR;
}

const char *kv_qext_isa_name(kv_qext_isa isa) {
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < sizeof names / sizeof names[0] ? names[isa] : "unknown";
}
