/* One instruction-set variant of isan's kernels; included once per target by isa.c.
 *
 * Before including, define:
 *   SFX(name)  append the variant's suffix to a name (e.g. name##_avx2)
 *   VL         floats per vector (4: SSE2 / NEON, 8: AVX2, 16: AVX-512)
 *   MR         rows per register tile of the grouped GEMM
 *   NVM        vectors per register tile (columns = NVM * VL)
 *   HAVE_F16C  1 if the variant may use the F16C conversion instructions
 * and KERNEL_NAME (the instruction set's name), and wrap the inclusion in `#pragma GCC target(...)` for
 * the instruction set. A further register tile of an instruction set already included defines
 * TILE_OF(name) too (the suffix of that first inclusion): then only the GEMM is compiled again and
 * every other primitive is the first inclusion's. The end of this file undefines them all.
 *
 * Everything here is plain C with GCC vector extensions; the compiler emits the variant's
 * instructions. Shapes and meaning are documented in native.h and in the numpy twins
 * (streams.py, sequential.py), which compute the same thing.
 */

#if MR > 16 || NVM > 8
#error "the tile dispatch below handles at most 16 rows and 8 vectors"
#endif

typedef float SFX(vf) __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t SFX(vi) __attribute__((vector_size(VL * 4), aligned(4)));
typedef float SFX(vf8) __attribute__((vector_size(32), aligned(4)));

/* float16 B (IEEE half, converted as it is read; products and sums in float32): read by the tile below when half is 1. */
static inline __attribute__((always_inline)) SFX(vf) SFX(load_hv)(const uint16_t *p) {
#if HAVE_F16C && VL == 16
    return (SFX(vf))_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif HAVE_F16C && VL == 8
    return (SFX(vf))_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    SFX(vf) v;
    for (int k = 0; k < VL; k++) v[k] = half_to_float(p[k]);
    return v;
#endif
}

/* ---- C[r][j0 : j0 + nv*VL] = sum_{i < kd} A[r][i] * B[i, j0 + ...], r < mr (one register tile).
 * B is packed in panels of 16 columns: element (i, c) at B[(c / 16) * kd * 16 + i * 16 + c % 16], so
 * a tile reads each of its vectors from one contiguous stream. ---- */
static inline __attribute__((always_inline)) void SFX(tile)(const int mr, const int nv, const float *const *A,
                                                            const void *B, const int kd, float *const *C,
                                                            const int j0, const char *pfp, const int pfn,
                                                            const int half) {
    SFX(vf) acc[MR][NVM];
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) acc[r][v] = (SFX(vf)){0};
    const float *a[MR];
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) a[r] = A[r];
    size_t bp[NVM]; /* element offsets of the tile's column vectors in B */
#pragma GCC unroll 8
    for (int v = 0; v < nv; v++) {
        const int c = j0 + v * VL;
        bp[v] = (size_t)(c / 16) * kd * 16 + (c % 16);
    }
    for (int i = 0; i < kd; i++) {
        SFX(vf) b[NVM];
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            b[v] = half ? SFX(load_hv)((const uint16_t *)B + bp[v] + (size_t)i * 16)
                        : *(const SFX(vf) *)((const float *)B + bp[v] + (size_t)i * 16);
        if (pfp) /* a share of the next matrix towards L2 while this one computes (never faults) */
            for (int q = 0; q < pfn; q++) __builtin_prefetch(pfp + ((size_t)i * pfn + q) * 64, 0, 2);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            const float s = a[r][i];
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) acc[r][v] += b[v] * s;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) *(SFX(vf) *)(C[r] + j0 + v * VL) = acc[r][v];
}

#define GEMM_DISPATCH                                                                                \
    switch (mr) { /* constant row counts (never above MR) for the tile's unrolled loops */            \
    case 1: TILE_NV(1) break;                                                                        \
    case 2: if (MR >= 2) { TILE_NV(2 <= MR ? 2 : MR) } break;                                 \
    case 3: if (MR >= 3) { TILE_NV(3 <= MR ? 3 : MR) } break;                                 \
    case 4: if (MR >= 4) { TILE_NV(4 <= MR ? 4 : MR) } break;                                 \
    case 5: if (MR >= 5) { TILE_NV(5 <= MR ? 5 : MR) } break;                                 \
    case 6: if (MR >= 6) { TILE_NV(6 <= MR ? 6 : MR) } break;                                 \
    case 7: if (MR >= 7) { TILE_NV(7 <= MR ? 7 : MR) } break;                                 \
    case 8: if (MR >= 8) { TILE_NV(8 <= MR ? 8 : MR) } break;                                 \
    case 9: if (MR >= 9) { TILE_NV(9 <= MR ? 9 : MR) } break;                                 \
    case 10: if (MR >= 10) { TILE_NV(10 <= MR ? 10 : MR) } break;                                 \
    case 11: if (MR >= 11) { TILE_NV(11 <= MR ? 11 : MR) } break;                                 \
    case 12: if (MR >= 12) { TILE_NV(12 <= MR ? 12 : MR) } break;                                 \
    case 13: if (MR >= 13) { TILE_NV(13 <= MR ? 13 : MR) } break;                                 \
    case 14: if (MR >= 14) { TILE_NV(14 <= MR ? 14 : MR) } break;                                 \
    case 15: if (MR >= 15) { TILE_NV(15 <= MR ? 15 : MR) } break;                                 \
    default: if (MR >= 16) { TILE_NV(16 <= MR ? 16 : MR) } break;                                    \
    }

#define TILE_NV(mr_)                                                                                 \
    switch (nv) {                                                                                    \
    case 1: SFX(tile)(mr_, 1, A + r0, B, kd, C + r0, j, pfp, pfn, half); break;                      \
    case 2: if (NVM >= 2) SFX(tile)(mr_, 2 <= NVM ? 2 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    case 3: if (NVM >= 3) SFX(tile)(mr_, 3 <= NVM ? 3 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    case 4: if (NVM >= 4) SFX(tile)(mr_, 4 <= NVM ? 4 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    case 5: if (NVM >= 5) SFX(tile)(mr_, 5 <= NVM ? 5 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    case 6: if (NVM >= 6) SFX(tile)(mr_, 6 <= NVM ? 6 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    case 7: if (NVM >= 7) SFX(tile)(mr_, 7 <= NVM ? 7 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    default: if (NVM >= 8) SFX(tile)(mr_, 8 <= NVM ? 8 : NVM, A + r0, B, kd, C + r0, j, pfp, pfn, half); break; \
    }

/* Rows given by pointers: C[r][j0:j1] = A[r][0:kd] @ B[0:kd, j0:j1] for r < n, B packed in panels
 * of 16 columns (see tile), float32 or (half) float16. j0 and j1 must be multiples of VL; rows of A
 * need kd readable floats. Column tiles outer: a tile's panel of B (kd x NVM*VL) stays in L1 while
 * every row block of the group goes through it (measured 10% faster than row blocks outer). With pf,
 * the tiles also prefetch pf_bytes (the next matrix) to L2, a share each, spread over their k loop. */
static inline __attribute__((always_inline)) void SFX(gemm_any)(const int n, const float *const *A, const void *B,
                                                                const int kd, const int j0, const int j1,
                                                                float *const *C, const void *pf,
                                                                const size_t pf_bytes, const int half) {
    const int ntile = ((j1 - j0 + NVM * VL - 1) / (NVM * VL)) * ((n + MR - 1) / MR);
    const size_t lines = (pf_bytes + 63) / 64, per_call = ntile > 0 ? (lines + ntile - 1) / ntile : 0;
    const int pfn = pf && kd > 0 ? (int)((per_call + kd - 1) / kd) : 0;
    int call = 0;
    for (int j = j0; j < j1; j += NVM * VL) {
        int nv = (j1 - j) / VL;
        if (nv > NVM) nv = NVM;
        for (int r0 = 0; r0 < n; r0 += MR, call++) {
            const int mr = n - r0 < MR ? n - r0 : MR;
            const char *pfp = pfn ? (const char *)pf + (size_t)call * kd * pfn * 64 : NULL;
            GEMM_DISPATCH
        }
    }
}

static void SFX(gemm_rows_pf)(const int n, const float *const *A, const float *B, const int kd, const int j0,
                              const int j1, float *const *C, const void *pf, const size_t pf_bytes) {
    SFX(gemm_any)(n, A, B, kd, j0, j1, C, pf, pf_bytes, 0);
}

static void SFX(gemm_rows)(const int n, const float *const *A, const float *B, const int kd,
                           const int j0, const int j1, float *const *C) {
    SFX(gemm_any)(n, A, B, kd, j0, j1, C, NULL, 0, 0);
}

/* B in float16 panels (the composed-jump tables stored in half precision). */
static void SFX(gemm_rows_h)(const int n, const float *const *A, const uint16_t *B, const int kd, const int j0,
                             const int j1, float *const *C, const void *pf, const size_t pf_bytes) {
    SFX(gemm_any)(n, A, B, kd, j0, j1, C, pf, pf_bytes, 1);
}
#undef TILE_NV
#undef GEMM_DISPATCH

#ifndef TILE_OF /* the primitives besides the GEMM: once an instruction set */
#define TILE_OF(name) SFX(name)
/* ---- exp on a vector (Cephes expf: range reduction to |r| <= ln2/2 and a degree-5 polynomial;
 * about 1 ulp). Inputs below -87 are clamped (the result is then ~1e-38, not 0). ---- */
static inline __attribute__((always_inline)) SFX(vf) SFX(vexp)(SFX(vf) x) {
    const SFX(vf) lo = (SFX(vf)){0} - 87.0f, hi = (SFX(vf)){0} + 88.0f;
    SFX(vi) m = x < lo;
    x = (SFX(vf))(((SFX(vi))x & ~m) | ((SFX(vi))lo & m));
    m = x > hi;
    x = (SFX(vf))(((SFX(vi))x & ~m) | ((SFX(vi))hi & m));
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    SFX(vf) t = x * 1.44269504088896341f + magic;
    SFX(vf) n = t - magic;
    SFX(vf) r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    SFX(vf) p = (SFX(vf)){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    SFX(vi) ni = (SFX(vi))t - (SFX(vi))((SFX(vf)){0} + magic);
    SFX(vf) scale = (SFX(vf))((ni + 127) << 23);
    return p * scale;
}

/* bits = -log2 softmax(l[0:V])[target]; l has Vp >= V floats (Vp a multiple of VL), lanes >= V
 * ignored (taken as -1e30 in registers: storing into them before a vector load stalls the load).
 * The max and the exponentials are float32; their sum and the log are float64 (the sum taken
 * lane-wise in double vectors, then pairwise across the lanes). */
typedef double SFX(vd) __attribute__((vector_size(VL * 8), aligned(8)));
static inline SFX(vf) SFX(lanes_lt)(const float *l, const int j, const int V) {
    SFX(vi) idx;
    for (int k = 0; k < VL; k++) idx[k] = j + k;
    const SFX(vi) in = idx < V;
    const SFX(vf) x = *(const SFX(vf) *)(l + j);
    return (SFX(vf))(((SFX(vi))x & in) | ((SFX(vi))((SFX(vf)){0} - 1e30f) & ~in));
}
static inline double SFX(lse_bits)(float *l, const int V, const int Vp, const int target) {
    SFX(vf) mv = SFX(lanes_lt)(l, 0, V);
    for (int j = VL; j < Vp; j += VL) {
        const SFX(vf) x = SFX(lanes_lt)(l, j, V);
        const SFX(vi) gt = x > mv;
        mv = (SFX(vf))(((SFX(vi))x & gt) | ((SFX(vi))mv & ~gt));
    }
    float mx[VL];
    memcpy(mx, &mv, sizeof mx);
#pragma GCC unroll 8
    for (int w = VL / 2; w >= 1; w /= 2)
#pragma GCC unroll 16
        for (int k = 0; k < w; k++) mx[k] = mx[k + w] > mx[k] ? mx[k + w] : mx[k];
    const float m = mx[0];
    SFX(vd) sv = (SFX(vd)){0};
    for (int j = 0; j < Vp; j += VL)
        sv += __builtin_convertvector(SFX(vexp)(SFX(lanes_lt)(l, j, V) - m), SFX(vd));
    double a[VL]; /* across the lanes pairwise: log2(VL) dependent additions, not VL */
    memcpy(a, &sv, sizeof a);
#pragma GCC unroll 8
    for (int w = VL / 2; w >= 1; w /= 2)
#pragma GCC unroll 16
        for (int k = 0; k < w; k++) a[k] += a[k + w];
    return ((double)m - (double)l[target] + log(a[0])) * 1.4426950408889634;
}

/* ---- matrix-vector products for the sequential composed path: y[i] = sum_{j<kd} M[i*kd + j] x[j].
 * M is row-major with rows of kd floats (no padding); x has kd floats. 8-wide vectors always
 * (memory-bound: wider vectors would not help); the tail beyond a multiple of 8 is scalar. ---- */
static inline __attribute__((always_inline)) float SFX(hsum8)(SFX(vf8) v) {
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += v[k];
    return s;
}

static void SFX(matvec_f32)(const float *M, const int rows, const int kd, const float *x, float *y) {
    const int kv = kd & ~7;
    int i = 0;
    for (; i + 4 <= rows; i += 4) {
        const float *m0 = M + (size_t)i * kd, *m1 = m0 + kd, *m2 = m1 + kd, *m3 = m2 + kd;
        SFX(vf8) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int j = 0; j < kv; j += 8) {
            const SFX(vf8) xv = *(const SFX(vf8) *)(x + j);
            a0 += *(const SFX(vf8) *)(m0 + j) * xv;
            a1 += *(const SFX(vf8) *)(m1 + j) * xv;
            a2 += *(const SFX(vf8) *)(m2 + j) * xv;
            a3 += *(const SFX(vf8) *)(m3 + j) * xv;
        }
        float s0 = SFX(hsum8)(a0), s1 = SFX(hsum8)(a1), s2 = SFX(hsum8)(a2), s3 = SFX(hsum8)(a3);
        for (int j = kv; j < kd; j++) {
            s0 += m0[j] * x[j]; s1 += m1[j] * x[j]; s2 += m2[j] * x[j]; s3 += m3[j] * x[j];
        }
        y[i] = s0; y[i + 1] = s1; y[i + 2] = s2; y[i + 3] = s3;
    }
    for (; i < rows; i++) {
        const float *m0 = M + (size_t)i * kd;
        SFX(vf8) a0 = {0};
        for (int j = 0; j < kv; j += 8) a0 += *(const SFX(vf8) *)(m0 + j) * *(const SFX(vf8) *)(x + j);
        float s0 = SFX(hsum8)(a0);
        for (int j = kv; j < kd; j++) s0 += m0[j] * x[j];
        y[i] = s0;
    }
}

static inline __attribute__((always_inline)) SFX(vf8) SFX(load_h8)(const uint16_t *p) {
#if HAVE_F16C
    return (SFX(vf8))_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    SFX(vf8) v;
    for (int k = 0; k < 8; k++) v[k] = half_to_float(p[k]);
    return v;
#endif
}

static void SFX(matvec_f16)(const uint16_t *M, const int rows, const int kd, const float *x, float *y) {
    const int kv = kd & ~7;
    int i = 0;
    for (; i + 4 <= rows; i += 4) {
        const uint16_t *m0 = M + (size_t)i * kd, *m1 = m0 + kd, *m2 = m1 + kd, *m3 = m2 + kd;
        SFX(vf8) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int j = 0; j < kv; j += 8) {
            const SFX(vf8) xv = *(const SFX(vf8) *)(x + j);
            a0 += SFX(load_h8)(m0 + j) * xv;
            a1 += SFX(load_h8)(m1 + j) * xv;
            a2 += SFX(load_h8)(m2 + j) * xv;
            a3 += SFX(load_h8)(m3 + j) * xv;
        }
        float s0 = SFX(hsum8)(a0), s1 = SFX(hsum8)(a1), s2 = SFX(hsum8)(a2), s3 = SFX(hsum8)(a3);
        for (int j = kv; j < kd; j++) {
            const float xj = x[j];
            s0 += half_to_float(m0[j]) * xj; s1 += half_to_float(m1[j]) * xj;
            s2 += half_to_float(m2[j]) * xj; s3 += half_to_float(m3[j]) * xj;
        }
        y[i] = s0; y[i + 1] = s1; y[i + 2] = s2; y[i + 3] = s3;
    }
    for (; i < rows; i++) {
        const uint16_t *m0 = M + (size_t)i * kd;
        SFX(vf8) a0 = {0};
        for (int j = 0; j < kv; j += 8) a0 += SFX(load_h8)(m0 + j) * *(const SFX(vf8) *)(x + j);
        float s0 = SFX(hsum8)(a0);
        for (int j = kv; j < kd; j++) s0 += half_to_float(m0[j]) * x[j];
        y[i] = s0;
    }
}

/* 1 if every |h[i]| <= limit for i < n (n a multiple of VL); NaN counts as out of range. */
static int SFX(row_ok)(const float *h, const int n, const float limit) {
    const SFX(vi) absmask = (SFX(vi)){0} + 0x7fffffff;
    const SFX(vf) lim = (SFX(vf)){0} + limit;
    SFX(vi) bad = (SFX(vi)){0};
    for (int j = 0; j < n; j += VL) {
        const SFX(vf) a = (SFX(vf))((*(const SFX(vi) *)(h + j)) & absmask);
        bad |= ~(a <= lim);
    }
    int any = 0;
    for (int k = 0; k < VL; k++) any |= bad[k];
    return !any;
}

/* max |h[i]| for i < n (n a multiple of VL); NaN may be ignored. */
static float SFX(row_absmax)(const float *h, const int n) {
    const SFX(vi) absmask = (SFX(vi)){0} + 0x7fffffff;
    SFX(vf) m = (SFX(vf)){0};
    for (int j = 0; j < n; j += VL) {
        const SFX(vf) a = (SFX(vf))((*(const SFX(vi) *)(h + j)) & absmask);
        const SFX(vi) gt = a > m;
        m = (SFX(vf))(((SFX(vi))a & gt) | ((SFX(vi))m & ~gt));
    }
    float r = 0.0f;
    for (int k = 0; k < VL; k++) r = m[k] > r ? m[k] : r;
    return r;
}

/* n rounds of 12 independent FMAs on vectors (the peak's microbenchmark); returns a sum so that
 * nothing is optimised away. */
static float SFX(fma_loop)(int64_t n) {
    const SFX(vf) a = (SFX(vf)){0} + 0.999999f, b = (SFX(vf)){0} + 1e-7f;
    SFX(vf) c0 = a * 0.0f, c1 = c0 + 1e-3f, c2 = c0 + 2e-3f, c3 = c0 + 3e-3f, c4 = c0 + 4e-3f, c5 = c0 + 5e-3f,
            c6 = c0 + 6e-3f, c7 = c0 + 7e-3f, c8 = c0 + 8e-3f, c9 = c0 + 9e-3f, c10 = c0 + 1e-2f, c11 = c0 + 1.1e-2f;
    for (int64_t r = 0; r < n; r++) {
        c0 = c0 * a + b; c1 = c1 * a + b; c2 = c2 * a + b; c3 = c3 * a + b; c4 = c4 * a + b; c5 = c5 * a + b;
        c6 = c6 * a + b; c7 = c7 * a + b; c8 = c8 * a + b; c9 = c9 * a + b; c10 = c10 * a + b; c11 = c11 * a + b;
    }
    const SFX(vf) t = ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) + ((c8 + c9) + (c10 + c11));
    float s = 0.0f;
    for (int k = 0; k < VL; k++) s += t[k];
    return s;
}

#endif

#define KSTR2(x) #x
#define KSTR(x) KSTR2(x)
static const Kernels SFX(kernels) = {
    .name = KERNEL_NAME, .variant = KERNEL_NAME "_" KSTR(MR) "x" KSTR(NVM), .vl = VL, .mr = MR, .nvm = NVM,
    .gemm_rows = SFX(gemm_rows), .gemm_rows_pf = SFX(gemm_rows_pf), .gemm_rows_h = SFX(gemm_rows_h),
    .lse_bits = TILE_OF(lse_bits), .matvec_f32 = TILE_OF(matvec_f32), .matvec_f16 = TILE_OF(matvec_f16),
    .row_ok = TILE_OF(row_ok), .row_absmax = TILE_OF(row_absmax), .fma_loop = TILE_OF(fma_loop),
};
#undef KSTR
#undef KSTR2

/* the parameters of this instantiation: the next one defines its own */
#undef SFX
#undef VL
#undef MR
#undef NVM
#undef HAVE_F16C
#undef KERNEL_NAME
#undef TILE_OF
