/* The instruction-set variants of the kernels' primitives (the Kernels table of native.h): kern_impl.h
 * compiled once per target and again per further register tile of the GEMM (TILE_OF: only the GEMM
 * is compiled again), and the choice among them. Which tile is fastest depends on the core (loads
 * per FMA, registers, L1 size): the engine times them at first use (isan.engine.kernels.autotune). */
#include "native.h"

/* ---- the portable baseline ---- */
#define SFX(name) name##_generic
#define VL 4
#define MR 4
#define NVM 2
#define HAVE_F16C 0
#define KERNEL_NAME "generic"
#include "kern_impl.h"  /* it undefines its own parameters at its end */

#if ISAN_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* 16 ymm registers: 3 x 4 (12 accumulators, 4 of B, a broadcast) the default; 4 x 3 and 6 x 2 load
 * less of B per FMA */
#define SFX(name) name##_avx2
#define VL 8
#define MR 3
#define NVM 4
#define HAVE_F16C 1
#define KERNEL_NAME "avx2"
#include "kern_impl.h"
#define SFX(name) name##_avx2_4x3
#define TILE_OF(name) name##_avx2
#define VL 8
#define MR 4
#define NVM 3
#define HAVE_F16C 1
#define KERNEL_NAME "avx2"
#include "kern_impl.h"
#define SFX(name) name##_avx2_6x2
#define TILE_OF(name) name##_avx2
#define VL 8
#define MR 6
#define NVM 2
#define HAVE_F16C 1
#define KERNEL_NAME "avx2"
#include "kern_impl.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma,f16c")
#define SFX(name) name##_avx512
#define VL 16
/* 14 rows x 2 vectors (28 of the 32 registers accumulate): a tile reads a 2-vector panel of B
 * (217 x 32 floats, 28 KB: stays in L1) against 6 x 4 before; long text 2.36M chars/s against
 * 2.08M on an AMD EPYC (development runs of each build, two threads, 5 repeats, on a machine whose
 * speed drifted by 10%; 8 x 3: 2.29M). The default; the others are the autotune's candidates for
 * cores where 14 row pointers (more than the general registers) or 16 loads a k step cost more:
 * 8 x 3 and 6 x 4 need fewer pointers and loads per FMA, 4 x 6 fewer still (its B panel leaves L1). */
#define MR 14
#define NVM 2
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"
#define SFX(name) name##_avx512_8x3
#define TILE_OF(name) name##_avx512
#define VL 16
#define MR 8
#define NVM 3
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"
#define SFX(name) name##_avx512_6x4
#define TILE_OF(name) name##_avx512
#define VL 16
#define MR 6
#define NVM 4
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"
#define SFX(name) name##_avx512_4x6
#define TILE_OF(name) name##_avx512
#define VL 16
#define MR 4
#define NVM 6
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"
#pragma GCC pop_options
#endif

const Kernels *KERN = &kernels_generic;

/* Every variant, each instruction set's default first; level: the instruction set it needs
 * (0 generic, 1 AVX2+FMA+F16C, 2 AVX-512F/VL). */
static const struct {
    const Kernels *k;
    int level;
} VARIANTS[] = {
    {&kernels_generic, 0},
#if ISAN_X86
    {&kernels_avx2, 1}, {&kernels_avx2_4x3, 1}, {&kernels_avx2_6x2, 1},
    {&kernels_avx512, 2}, {&kernels_avx512_8x3, 2}, {&kernels_avx512_6x4, 2}, {&kernels_avx512_4x6, 2},
#endif
};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

/* The instruction-set level this CPU runs (see VARIANTS). */
static int cpu_level(void) {
#if ISAN_X86
    __builtin_cpu_init();
    const int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
    if (has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return 2;
    return has_avx2 ? 1 : 0;
#else
    return 0;
#endif
}

const Kernels *choose_kernels(const char *want) {
    const int level = cpu_level();
    if (!want || !*want) { /* the best instruction set's default tile */
        const Kernels *best = &kernels_generic;
        int best_level = -1;
        for (int i = 0; i < N_VARIANTS; i++)
            if (VARIANTS[i].level <= level && VARIANTS[i].level > best_level) {
                best = VARIANTS[i].k;
                best_level = VARIANTS[i].level;
            }
        return best;
    }
    for (int i = 0; i < N_VARIANTS; i++) /* an instruction set (its default tile) or a variant */
        if (strcmp(want, VARIANTS[i].k->name) == 0 || strcmp(want, VARIANTS[i].k->variant) == 0)
            return VARIANTS[i].level <= level ? VARIANTS[i].k : NULL;
    return NULL;
}

int kernel_variants(const Kernels **out, int cap) {
    const int level = cpu_level();
    int n = 0;
    for (int i = 0; i < N_VARIANTS && n < cap; i++)
        if (VARIANTS[i].level <= level) out[n++] = VARIANTS[i].k;
    return n;
}
