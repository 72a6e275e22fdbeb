/* cpu_isa.h - the instruction-set levels of the CPU kernels and the run-time
 * probe that says which this CPU has. A leaf: the kernel files (matmul*.c,
 * cpu_attention*.c) and the backend (cpu.c) include it; it includes nothing
 * of theirs. */
#ifndef KV_CPU_ISA_H
#define KV_CPU_ISA_H

/* Instruction-set levels, lowest first. Every kernel has a scalar reference;
 * the SIMD levels live in <module>_avx2.c / <module>_avx512.c, compiled for
 * their target with a file-wide pragma and called only when the CPU has it. */
typedef enum kv_cpu_isa {
    KV_CPU_ISA_SCALAR = 0, /* portable C, the reference */
    KV_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KV_CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VNNI (+ AVX2/FMA/F16C) */
    KV_CPU_ISA_COUNT
} kv_cpu_isa;

#if defined(__x86_64__) || defined(__i386__)
#define KV_HAVE_X86_KERNELS 1 /* the AVX2 / AVX-512 files are compiled in */
#endif

/* 1 when this build and this CPU can run isa. The CPU is probed once per
 * process (cpuid traps to the hypervisor in a VM); thread-safe. */
int kv_cpu_isa_supported(kv_cpu_isa isa);
/* 1 when the AVX-512 level can also use AMX-INT8 tiles (the batched
 * quantized matmul, matmul_amx.c): the CPU has them, the OS saves their
 * state and this process has been granted it. Probed with the levels. */
int kv_cpu_amx_supported(void);
/* The fastest supported ISA. */
kv_cpu_isa kv_cpu_isa_best(void);
/* isa, or the best level below it this CPU has (out-of-range values are
 * clamped first). */
kv_cpu_isa kv_cpu_isa_usable(kv_cpu_isa isa);
const char *kv_cpu_isa_name(kv_cpu_isa isa); /* "scalar", "avx2", "avx512"; "unknown" */
/* Parses a name of kv_cpu_isa_name into *out (OUT). Returns 0 or -1. */
int kv_cpu_isa_from_name(const char *name, kv_cpu_isa *out);

#endif
