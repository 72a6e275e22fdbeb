/* cpu_isa.c - which SIMD levels this CPU runs, probed once, and their names. */
#include "cpu_isa.h"

#include <pthread.h>
#include <string.h>

#ifdef KV_HAVE_X86_KERNELS
#include <cpuid.h>
#endif

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
