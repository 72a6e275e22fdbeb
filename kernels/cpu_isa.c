/* cpu_isa.c - which SIMD levels this CPU runs, probed once, and their names. */
#include "cpu_isa.h"

#include <pthread.h>
#include <string.h>

#ifdef KV_HAVE_X86_KERNELS
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int isa_ok[KV_CPU_ISA_COUNT]; /* written once under isa_once */
static int amx_ok;                   /* likewise */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

#ifdef KV_HAVE_X86_KERNELS
/* AMX-INT8 needs three things: the CPU has it (cpuid leaf 7: AMX-TILE, EDX
 * bit 24; AMX-INT8, bit 25), the OS saves the tile state (XCR0 bits 17-18,
 * read with xgetbv once cpuid says OSXSAVE), and, on Linux, this process
 * asked for the 8 KiB tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA: the permission is the whole process's, so any thread
 * may ask once before any uses a tile). Elsewhere AMX stays off. */
static int amx_probe(void) {
#if defined(__linux__) && defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}
#endif

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
    amx_ok = isa_ok[KV_CPU_ISA_AVX512] && amx_probe();
#endif
}

int kv_cpu_isa_supported(kv_cpu_isa isa) {
    if ((int)isa < 0 || isa >= KV_CPU_ISA_COUNT) return 0;
    pthread_once(&isa_once, isa_probe);
    return isa_ok[isa];
}

int kv_cpu_amx_supported(void) {
    pthread_once(&isa_once, isa_probe);
    return amx_ok;
}

kv_cpu_isa kv_cpu_isa_best(void) {
    for (int i = KV_CPU_ISA_COUNT - 1; i > 0; i--)
        if (kv_cpu_isa_supported((kv_cpu_isa)i)) return (kv_cpu_isa)i;
    return KV_CPU_ISA_SCALAR;
}

kv_cpu_isa kv_cpu_isa_usable(kv_cpu_isa isa) {
    int i = (int)isa < 0 ? 0 : isa >= KV_CPU_ISA_COUNT ? KV_CPU_ISA_COUNT - 1 : (int)isa;
    while (i > 0 && !kv_cpu_isa_supported((kv_cpu_isa)i)) i--;
    return (kv_cpu_isa)i;
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
