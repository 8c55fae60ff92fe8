/* isan.engine.kernels._native: the compiled hot loops of the engine. What every file of it shares.
 *
 * Three kernels, each with a numpy twin of the same signature (isan/engine/kernels/streams.py,
 * jumps.py and sequential.py) that the tests hold it equal to:
 *
 * run_streams: many independent state rows advanced one character a step, the rows grouped by the
 *   symbol they read next so that each symbol's matrix serves all its rows in one register-blocked
 *   GEMM (each row waits in its symbol's queue; a round steps the longest queues). Used for batches
 *   of texts and for chunk-parallel scoring of one long text (each chunk a row). With pairs
 *   (chunk-parallel correction), rows [P, 2P) are error rows that follow rows [0, P) through the
 *   same symbols without bias and without readout, and a pair stops once its error is small
 *   against its state.
 *   Threads: split by rows (the default), each thread runs its own block of rows alone, with no
 *   barrier; split by columns, each owns a slice of the output columns of every GEMM, with one
 *   barrier a round. No Python and no GIL inside.
 *
 * run_jumps: the same rows advanced by composed jumps of a trie table's keys, grouped by the key
 *   they take next (each row's greedy longest match): one product per key for all its rows gives
 *   the k readouts inside the jump and the state after it.
 *
 * seq_composed: one stream through a trie table: for each match (entry e, k characters) the k
 *   readouts [R_i | r_i] [h; 1] and the jump h <- [A | c] [h; 1] (float32 or float16 storage).
 *
 * Layout (row-vector convention, homogeneous coordinate): a state row is [h_0 .. h_{d-1}, 1, 0...]
 * of dp = roundup(d + 1, 16) floats; WT[x] (dp, dp) holds [[W[x], b[x]], [0, 1]] transposed, so
 * row @ WT[x] is the next state row (an error row carries 0 in place of 1: no bias). RoT (dp, Vp)
 * holds [W_ro | b_ro] transposed, so row @ RoT are the logits (Vp = roundup(V, 16)).
 *
 * Instruction sets: the kernels are compiled for AVX-512, AVX2+FMA+F16C and a portable baseline,
 * and the best one the CPU supports is chosen when the module loads (isa() tells which); the x86
 * ones in several register tiles of the GEMM (variants(); set_isa chooses one, time_gemm times one:
 * isan.engine.kernels.autotune picks the fastest at first use).
 *
 * The files, one concept each (setup.py compiles them into the one extension):
 *   native.h      this header: the table of one instruction set's primitives (Kernels)
 *   isa.c         the three instruction-set variants of those primitives (kern_impl.h, included
 *                 once per variant) and the choice among them
 *   team.h/.c     the thread team of a call (run_parallel), its barrier, the fault-injection hooks
 *   queues.h      the per-thread queues of rows by the symbol or table entry they read next
 *   jobs.h        what a kernel is given: RowsJob, shared by every rows kernel and embedded in
 *                 StreamsJob and JumpsJob (as mamba's SSMParamsBase in each kernel's params), SeqJob
 *   rows.h/.c     the rows scheduler both rows kernels run: the queues by key, the stops (finished,
 *                 diverged, converged), the final states, the readout and range check before each
 *                 step; a kernel gives only its key and its step (RowsOps)
 *   trie.h        the greedy longest-match walk along a table's trie (run_jumps, trie_segment)
 *   streams.c, jumps.c, seq.c
 *                 the kernels run_streams, run_jumps and seq_composed (no Python, no GIL)
 *   bindings.c    the Python module: argument checks (keyword arguments), a job filled, run and
 *                 released
 */
#ifndef ISAN_NATIVE_H
#define ISAN_NATIVE_H

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define ISAN_X86 1
#include <immintrin.h>
#define CPU_RELAX() __builtin_ia32_pause()
#else
#define ISAN_X86 0
#define CPU_RELAX() ((void)0)
#endif

/* 8-wide vectors in the portable variant are emulated; GCC notes that their ABI differs. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* IEEE half to float (portable; the x86 variants use F16C instead). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

typedef struct {
    const char *name;    /* the instruction set: "generic", "avx2", "avx512" */
    const char *variant; /* with its register tile, rows x vectors: "avx512_14x2" */
    int vl, mr, nvm;
    void (*gemm_rows)(int n, const float *const *A, const float *B, int kd, int j0, int j1, float *const *C);
    void (*gemm_rows_pf)(int n, const float *const *A, const float *B, int kd, int j0, int j1, float *const *C,
                         const void *pf, size_t pf_bytes); /* and prefetch pf_bytes at pf to L2 */
    void (*gemm_rows_h)(int n, const float *const *A, const uint16_t *B, int kd, int j0, int j1, float *const *C,
                        const void *pf, size_t pf_bytes);
    double (*lse_bits)(float *l, int V, int Vp, int target);
    void (*matvec_f32)(const float *M, int rows, int kd, const float *x, float *y);
    void (*matvec_f16)(const uint16_t *M, int rows, int kd, const float *x, float *y);
    int (*row_ok)(const float *h, int n, float limit);
    float (*row_absmax)(const float *h, int n);
    float (*fma_loop)(int64_t n); /* n rounds of 12 independent vector FMAs: 24 VL FLOPs a round */
} Kernels;

/* The variant the kernels run with (isa.c): the best one this CPU supports, or set_isa's. */
extern const Kernels *KERN;

/* The variant called want: an instruction set ("generic", "avx2", "avx512": its default tile), a
 * variant ("avx512_6x4"), NULL or "" (the best instruction set's default tile); NULL if this CPU
 * cannot run it or there is none of that name. */
const Kernels *choose_kernels(const char *want);

/* The variants this CPU runs (at most cap, into out), each instruction set's default first. */
int kernel_variants(const Kernels **out, int cap);

#endif
