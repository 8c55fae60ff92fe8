/* The instruction-set variants of the kernels' primitives (the Kernels table of native.h): kern_impl.h
 * compiled once per target, and the choice among them. */
#include "native.h"

/* ---- the portable baseline ---- */
#define SFX(name) name##_generic
#define VL 4
#define MR 4
#define NVM 2
#define HAVE_F16C 0
#define KERNEL_NAME "generic"
#include "kern_impl.h"  /* it undefines its parameters at its end */

#if ISAN_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SFX(name) name##_avx2
#define VL 8
#define MR 3
#define NVM 4
#define HAVE_F16C 1
#define KERNEL_NAME "avx2"
#include "kern_impl.h"  /* it undefines its parameters at its end */
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma,f16c")
#define SFX(name) name##_avx512
#define VL 16
/* 14 rows x 2 vectors (28 of the 32 registers accumulate): a tile reads a 2-vector panel of B
 * (217 x 32 floats, 28 KB: stays in L1) against 6 x 4 before; long text 2.36M chars/s against
 * 2.08M (development runs of each build, two threads, 5 repeats, on a machine whose speed drifted
 * by 10%; 8 x 3: 2.29M) */
#define MR 14
#define NVM 2
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"  /* it undefines its parameters at its end */
#pragma GCC pop_options
#endif

const Kernels *KERN = &kernels_generic;

const Kernels *choose_kernels(const char *want) {
    if (want && strcmp(want, "generic") == 0) return &kernels_generic;
#if ISAN_X86
    __builtin_cpu_init();
    const int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
    const int has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    if (want && strcmp(want, "avx2") == 0) return has_avx2 ? &kernels_avx2 : NULL;
    if (want && strcmp(want, "avx512") == 0) return has_avx512 ? &kernels_avx512 : NULL;
    if (want && *want) return NULL;
    if (has_avx512) return &kernels_avx512;
    if (has_avx2) return &kernels_avx2;
#else
    if (want && *want) return NULL;
#endif
    return &kernels_generic;
}
