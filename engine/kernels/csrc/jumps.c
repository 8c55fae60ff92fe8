/* run_jumps: run_streams with composed jumps. Each round every scheduled row takes one jump: the
 * longest entry of the jump table that matches its text from its position (trie.h's walk, never
 * past the row's end; every single symbol is an entry). The schedule, the stops and the readout
 * before each jump are the rows scheduler's (rows.h), by entry instead of symbol, so each
 * entry's matrix is read once a round for all its rows:
 *   state:    row <- row @ M_e[:, 0:dp]            ([A_s | c_s] transposed, as WT)
 *   readouts: logits_i = row @ M_e[:, dp + (i-1) Vp : dp + i Vp], i = 1 .. k-1
 *             ([W_ro A_{s[:i]} | W_ro c_{s[:i]} + b_ro] transposed);
 * the readout before the jump (i = 0) is RoT for every row, as in run_streams. M_e is (kd,
 * dp + (k-1) Vp) in panels of 16 columns, entries concatenated (m_off: where each starts, floats).
 * Rows are split between threads (each runs its own block alone). Positions, steps and
 * divergences are counted in characters; a pair's error is checked every check_every jumps.
 */
#include "rows.h"
#include "trie.h"

/* the entry a row takes next: the greedy longest match from pos, not past the row's end */
static int jumps_key(void *job, int s, int64_t pos, int *chars) {
    const JumpsJob *J = (const JumpsJob *)job;
    const RowsJob *R = &J->rows;
    const int64_t avail = R->len[s] - pos, n = avail < J->max_k ? avail : J->max_k;
    int64_t len;
    const int e = trie_longest(J->children, J->entry_of, R->nsym, J->n_nodes, R->ids + R->start[s] + pos, n, &len);
    *chars = J->klen[e];
    return e;
}

/* a row's text and bits were last touched when it joined its queue, maybe many rounds ago: fetch
 * the lines of this jump (the targets read and the bits written) and of the next walk while the
 * readout computes */
static void jumps_prepare(void *job, const RowSched *S) {
    const JumpsJob *J = (const JumpsJob *)job;
    const RowsJob *R = &J->rows;
    for (int a = 0; a < S->n_rows; a++) {
        const int s = S->rows[a], ls = s - S->r0;
        const int64_t p = R->start[s] + S->pos[ls], k = S->chars[ls], end = R->start[s] + R->len[s];
        const int64_t walk_end = p + k + J->max_k - 1 < end ? p + k + J->max_k - 1 : end - 1;
        __builtin_prefetch(R->ids + p);
        __builtin_prefetch(R->ids + walk_end);
        if (R->bits) {
            __builtin_prefetch(R->bits + p, 1);
            __builtin_prefetch(R->bits + p + k - 1, 1);
        }
    }
}

/* C[r][j0:j1] = A[r] @ entry e's matrix (float32 or float16), pf_bytes at pf prefetched meanwhile */
static void jumps_gemm(const JumpsJob *J, int e, int n, const float *const *A, int j0, int j1, float *const *C,
                       const void *pf, size_t pf_bytes) {
    const RowsJob *R = &J->rows;
    if (J->f16) R->K->gemm_rows_h(n, A, (const uint16_t *)J->M + J->m_off[e], R->kd, j0, j1, C, pf, pf_bytes);
    else R->K->gemm_rows_pf(n, A, J->M + J->m_off[e], R->kd, j0, j1, C, pf, pf_bytes);
}

/* Group g: the jump of its rows (and their error rows), the matrix of the next group (or, after
 * the last, of the longest queue left) prefetched towards L2 meanwhile; then the readouts inside
 * the jump, from the same matrix. */
static void jumps_step(void *job, RowSched *S, int g, int j0, int j1) {
    const JumpsJob *J = (const JumpsJob *)job;
    const RowsJob *R = &J->rows;
    const Kernels *K = R->K;
    const int dp = R->dp, Vp = R->Vp, kd = R->kd;
    const size_t isz = J->f16 ? 2 : 4;
    const int e = S->grp_key[g], k = J->klen[e], e2 = rows_next_key(S, g);
    const void *pf = e2 >= 0 ? (const char *)J->M + J->m_off[e2] * isz : NULL;
    const size_t pf_bytes = e2 >= 0 ? (size_t)kd * (dp + (size_t)(J->klen[e2] - 1) * Vp) * isz : 0;
    int p0, p1;
    rows_group(S, g, &p0, &p1);
    jumps_gemm(J, e, p1 - p0, S->A + p0, j0, j1, S->C + p0, pf, pf_bytes);
    if (!R->bits || k < 2) return;
    const int g0 = S->grp_start[g], g1 = S->grp_start[g + 1];
    float *sp[64];
    for (int i = 0; i < 64; i++) sp[i] = S->scr + (size_t)i * R->scratch_w;
    for (int b0 = g0; b0 < g1; b0 += 64) {
        const int nb = g1 - b0 < 64 ? g1 - b0 : 64;
        jumps_gemm(J, e, nb, S->Ar + b0, dp, dp + (k - 1) * Vp, sp, NULL, 0);
        for (int i = 0; i < nb; i++) {
            const int s = S->rows[b0 + i], ls = s - S->r0;
            const int64_t p = R->start[s] + S->pos[ls];
            for (int c = 1; c < k; c++) {
                const double b = K->lse_bits(sp[i] + dp + (size_t)(c - 1) * Vp, R->V, Vp, R->ids[p + c]);
                R->bits[p + c] = b;
                if (!isfinite(b)) rows_diverged(S, s, S->pos[ls] + c);
            }
        }
    }
}

static const RowsOps JUMPS_OPS = {.key = jumps_key, .prepare = jumps_prepare, .step = jumps_step};

void jumps_set_nt(void *arg, int nt) {
    JumpsJob *J = (JumpsJob *)arg;
    RowsJob *R = &J->rows;
    R->nkeys = J->n_ent;
    R->split_cols = 0;
    R->scratch_w = R->dp + (J->max_k > 1 ? (J->max_k - 1) : 0) * R->Vp; /* a readout scratch row */
    rows_set_nt(R, nt);
}

void jumps_work(void *arg, int tid, int nt) { rows_work(&((JumpsJob *)arg)->rows, &JUMPS_OPS, arg, tid, nt); }
