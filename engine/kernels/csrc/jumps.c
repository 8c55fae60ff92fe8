/* run_jumps: run_streams with composed jumps (issue 22). Each round every active row takes one
 * jump: the longest entry of the jump table that matches its text from its position (a walk down
 * the table's trie, never past the row's end; every single symbol is an entry). The rows of a
 * round are grouped by entry, so each entry's matrix is read once a round for all its rows:
 *   state:    row <- row @ M_e[:, 0:dp]            ([A_s | c_s] transposed, as WT)
 *   readouts: logits_i = row @ M_e[:, dp + (i-1) Vp : dp + i Vp], i = 1 .. k-1
 *             ([W_ro A_{s[:i]} | W_ro c_{s[:i]} + b_ro] transposed);
 * the readout before the jump (i = 0) is RoT for every row, as in run_streams. M_e is (kd,
 * dp + (k-1) Vp) in panels of 16 columns, entries concatenated (m_off: where each starts, floats).
 * Rows are split between threads (each runs its own block alone). Positions, steps and
 * divergences are counted in characters; a pair's error is checked every check_every rounds.
 */
#include "jobs.h"

void jumps_set_nt(void *arg, int nt) {
    JumpsJob *J = (JumpsJob *)arg;
    RowsJob *const R = &J->rows;
    R->nt = nt;
    barrier_init(&R->bar, 1);
}

/* the entry of the longest table key that ids[p : p + avail] starts with (avail >= 1; every single
 * symbol is a key): the greedy longest match, not past the row's end */
static inline int jumps_longest(const JumpsJob *J, const int32_t *x, int64_t avail) {
    const RowsJob *const R = &J->rows;
    int32_t node = 0;
    int best = -1;
    const int64_t lim = avail < J->max_k ? avail : J->max_k;
    for (int64_t j = 0; j < lim; j++) {
        node = J->children[(size_t)node * R->nsym + x[j]];
        if (node < 0) break;
        if (J->entry_of[node] >= 0) best = J->entry_of[node];
    }
    return best;
}

void jumps_work(void *arg, int tid, int nt) {
    JumpsJob *J = (JumpsJob *)arg;
    RowsJob *const R = &J->rows;
    const Kernels *K = R->K;
    int sense = 0;
    const int dp = R->dp, kd = R->kd, Vp = R->Vp, V = R->V, P = R->P, E = J->n_ent;
    const int r0 = (int)((int64_t)P * tid / nt), r1 = (int)((int64_t)P * (tid + 1) / nt), nr = r1 - r0;
    const int VLk = K->vl, jmax = (R->d + VLk - 1) / VLk * VLk;
    const int width = dp + (J->max_k > 1 ? (J->max_k - 1) : 0) * Vp; /* a readout scratch row */
    const size_t isz = J->f16 ? 2 : 4;
    int *active = (int *)malloc(sizeof(int) * (nr + 1));
    int *ent = (int *)malloc(sizeof(int) * (nr + 1)); /* the entry each row takes next (local index) */
    int64_t *pos = (int64_t *)calloc(nr + 1, sizeof(int64_t));
    int64_t *nj = (int64_t *)calloc(nr + 1, sizeof(int64_t)); /* jumps taken: the state is in H when even */
    SymQueues Q;
    const int q_ok = symq_init(&Q, E, nr);
    char *dead = (char *)calloc(nr + 1, 1);
    int *gent = (int *)malloc(sizeof(int) * (E + 1));
    int *gstart = (int *)malloc(sizeof(int) * (E + 2));
    const float **Ap = (const float **)malloc(sizeof(float *) * (nr + 1));
    float **Cp = (float **)malloc(sizeof(float *) * (nr + 1));
    const float **EAp = (const float **)malloc(sizeof(float *) * (nr + 1));
    float **ECp = (float **)malloc(sizeof(float *) * (nr + 1));
    float *scr = (float *)aligned_alloc(64, sizeof(float) * 64 * (size_t)(width > Vp ? width : Vp));
    float *sp[64];
    int ok = active && ent && pos && nj && q_ok && dead && gent && gstart && Ap && Cp && EAp && ECp && scr &&
             R->fault_tid != tid;
    if (!ok) atomic_store(&R->fail, 1);
    R->total_steps[tid] = 0;
    J->jumps[tid] = 0;
    if (!barrier_wait_any(&R->bar, &sense, !ok)) {
        /* rows wait in the queue of the entry they take next (the greedy longest match from where they
         * are); a round takes the queues at least `frac` of the longest, so a composed matrix is read
         * once for all the rows of its queue (the schedule of run_streams, by entry instead of symbol) */
        int n = 0, live = nr, ng = 0;
        for (int s = r0; s < r1; s++) active[n++] = s; /* as if stepped last round: queued or stopped */
        int64_t steps = 0;
        for (int64_t t = 0;; t++) {
            /* between rounds: the rows of the last round that diverged, finished or (pairs, every
             * check_every jumps) converged stop; the others join the queue of their next entry */
            for (int a = 0; a < n; a++) {
                const int s = active[a], ls = s - r0;
                int stop = 0;
                if (dead[ls] || pos[ls] >= R->len[s]) stop = 1;
                else if (R->pairs && nj[ls] > 0 && nj[ls] % R->check_every == 0) {
                    const float r = pair_residual(K, state_buf(R->H, R->Hb, nj[ls]), s, P, dp);
                    R->residual[s] = r;
                    if (r <= R->stop_ratio) stop = 1;
                }
                if (stop) {
                    live--;
                    R->steps_done[s] = pos[ls] < R->len[s] ? pos[ls] : R->len[s];
                    if (nj[ls] & 1) final_to_H(R->H, R->Hb, s, P, R->pairs, dp);
                    continue;
                }
                ent[ls] = jumps_longest(J, R->ids + R->start[s] + pos[ls], R->len[s] - pos[ls]);
                symq_push(&Q, ls, ent[ls]);
            }
            if (live == 0) break;
            /* this round's queues: whole groups of one entry each */
            const int thr = symq_threshold(&Q, R->frac);
            n = 0;
            ng = 0;
            for (int e = 0; e < E; e++)
                if (Q.cnt[e] >= thr) {
                    gent[ng] = e;
                    gstart[ng++] = n;
                    n += symq_take(&Q, e, r0, active + n);
                }
            gstart[ng] = n;
            /* a row's text and bits were last touched when it joined its queue, maybe many rounds
             * ago: fetch the lines of this jump (the targets read and the bits written) and of the
             * next walk while the readout below computes */
            for (int a = 0; a < n; a++) {
                const int s = active[a], ls = s - r0;
                const int64_t p = R->start[s] + pos[ls], k = J->klen[ent[ls]], end = R->start[s] + R->len[s];
                const int64_t walk_end = p + k + J->max_k - 1 < end ? p + k + J->max_k - 1 : end - 1;
                __builtin_prefetch(R->ids + p);
                __builtin_prefetch(R->ids + walk_end);
                if (R->bits) {
                    __builtin_prefetch(R->bits + p, 1);
                    __builtin_prefetch(R->bits + p + k - 1, 1);
                }
            }
            /* each row's state (and its error row's) and where the jump writes them */
            for (int q = 0; q < n; q++) {
                const int s = active[q];
                const float *cur = state_buf(R->H, R->Hb, nj[s - r0]);
                float *nxt = state_buf(R->H, R->Hb, nj[s - r0] + 1);
                Ap[q] = cur + (size_t)s * dp;
                Cp[q] = nxt + (size_t)s * dp;
                if (R->pairs) {
                    EAp[q] = cur + (size_t)(s + P) * dp;
                    ECp[q] = nxt + (size_t)(s + P) * dp;
                }
            }
            /* the readout before each jump, with the range check */
            for (int b0 = 0; b0 < n; b0 += 64) {
                const int nb = n - b0 < 64 ? n - b0 : 64;
                if (R->bits) {
                    for (int i = 0; i < nb; i++) sp[i] = scr + (size_t)i * Vp;
                    K->gemm_rows(nb, Ap + b0, R->RoT, kd, 0, Vp, sp);
                }
                for (int i = 0; i < nb; i++) {
                    const int s = active[b0 + i], ls = s - r0;
                    const int64_t p = R->start[s] + pos[ls];
                    double b = 0.0;
                    if (R->bits) {
                        b = K->lse_bits(sp[i], V, Vp, R->ids[p]);
                        R->bits[p] = b;
                    }
                    if ((!K->row_ok(Ap[b0 + i], dp, R->limit) || !isfinite(b)) && !dead[ls]) {
                        dead[ls] = 1;
                        R->diverged[s] = pos[ls];
                    }
                }
            }
            /* the jumps, group by group; the matrix of the next group (or, after the last, of the
             * longest queue left: the likely next round) is prefetched towards L2 meanwhile */
            const int e_next = symq_longest(&Q);
            for (int g = 0; g < ng; g++) {
                const int e = gent[g], g0 = gstart[g], g1 = gstart[g + 1];
                const float *Me = J->M + J->m_off[e];
                const uint16_t *Mh = (const uint16_t *)J->M + J->m_off[e];
                const int k = J->klen[e];
                const int e2 = g + 1 < ng ? gent[g + 1] : e_next;
                const void *pf = e2 >= 0 ? (const char *)J->M + J->m_off[e2] * isz : NULL;
                const size_t pf_bytes = e2 >= 0 ? (size_t)kd * (dp + (size_t)(J->klen[e2] - 1) * Vp) * isz : 0;
#define JGEMM(n_, A_, j0_, j1_, C_, pf_, pfb_) \
    (J->f16 ? K->gemm_rows_h(n_, A_, Mh, kd, j0_, j1_, C_, pf_, pfb_) : K->gemm_rows_pf(n_, A_, Me, kd, j0_, j1_, C_, pf_, pfb_))
                JGEMM(g1 - g0, Ap + g0, 0, jmax, Cp + g0, pf, pf_bytes);
                if (R->pairs) JGEMM(g1 - g0, EAp + g0, 0, jmax, ECp + g0, NULL, 0);
                if (R->bits && k > 1) { /* the readouts inside the jump, from the same matrix */
                    for (int b0 = g0; b0 < g1; b0 += 64) {
                        const int nb = g1 - b0 < 64 ? g1 - b0 : 64;
                        for (int i = 0; i < nb; i++) sp[i] = scr + (size_t)i * width;
                        JGEMM(nb, Ap + b0, dp, dp + (k - 1) * Vp, sp, NULL, 0);
                        for (int i = 0; i < nb; i++) {
                            const int s = active[b0 + i], ls = s - r0;
                            const int64_t p = R->start[s] + pos[ls];
                            for (int c = 1; c < k; c++) {
                                const double b = K->lse_bits(sp[i] + dp + (size_t)(c - 1) * Vp, V, Vp, R->ids[p + c]);
                                R->bits[p + c] = b;
                                if (!isfinite(b) && !dead[ls]) {
                                    dead[ls] = 1;
                                    R->diverged[s] = pos[ls] + c;
                                }
                            }
                        }
                    }
                }
#undef JGEMM
            }
            for (int a = 0; a < n; a++) {
                const int ls = active[a] - r0, k = J->klen[ent[ls]];
                pos[ls] += k;
                nj[ls]++;
                steps += k;
            }
            J->jumps[tid] += n;
        }
        R->total_steps[tid] = steps;
    }
    free(active); free(ent); free(pos); free(nj); symq_free(&Q);
    free(dead); free(gent); free(gstart);
    free(Ap); free(Cp); free(EAp); free(ECp); free(scr);
}