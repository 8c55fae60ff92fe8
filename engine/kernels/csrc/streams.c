/* run_streams: many state rows advanced one character a step, grouped by symbol (native.h).
 *
 * Two ways to share the work among threads:
 *   split by columns (ROWS_SHARED): every thread schedules all rows; in each round it computes its
 *     own slice of output columns of every symbol group and the readouts of its share of the rows;
 *     one barrier a round. Every symbol group is as large as it can be and each thread reads only
 *     its slice of each matrix: best when rows are few.
 *   split by rows: each thread owns a contiguous block of rows and runs them alone, no barrier:
 *     best when rows are many.
 * Either way each thread builds its own copy of the schedule (the same one, from the same data),
 * so no thread waits for another between rounds except at the barrier.
 *
 * The schedule (issue 22): rows are independent, so they need not move in step. Each row waits
 * in the queue of the symbol it reads next, with its own count of steps taken; a round takes the
 * queues that are at least `frac` of the longest one (split by rows; split by columns, every
 * non-empty queue, one barrier a round as before), reads their rows out and steps them. A rare
 * symbol's matrix is then read once for the rows that have gathered on it instead of every round
 * for one or two: on text8 at 256 rows a thread, about 21 rows a matrix against 11 in step. The
 * order of the steps does not change any row's arithmetic (a row's product is the same whatever
 * group it is in), so the bits are those of the in-step schedule, bit for bit.
 */
#include "jobs.h"

typedef struct {    /* one thread's schedule; rows indexed from r0 */
    int64_t *tt;    /* steps each row has taken: its state is in H when even, in Hb when odd */
    char *stopped;
    SymQueues q;    /* the rows waiting, by the symbol each reads next */
    int *prev, n_prev; /* the rows stepped in the last round (true rows) */
    int *rows, n_rows; /* this round's true rows, grouped by symbol */
    int *grp_sym, *grp_start, n_grp; /* this round's groups: symbol and start in Aptr (n_grp + 1 starts) */
    const float **Aptr;
    float **Cptr;
    int live;       /* rows not stopped */
    int r0, r1;     /* rows this thread schedules (all rows when split by columns) */
} Sched;

/* A row stops after done steps: its final state goes to H (and its error row's, with pairs). */
static void stop_row(StreamsJob *J, Sched *S, int s, int writes) {
    RowsJob *const R = &J->rows;
    const int64_t done = S->tt[s - S->r0];
    S->stopped[s - S->r0] = 1;
    S->live--;
    if (!writes) return;
    R->steps_done[s] = done;
    if (done & 1) final_to_H(R->H, R->Hb, s, R->P, R->pairs, R->dp);
}

/* A row that has not stopped: stop it if it is at its end or (pairs, every check_every steps) its
 * error is small, else put it in the queue of the symbol it reads next. */
static void enqueue_row(StreamsJob *J, Sched *S, int s, int writes) {
    RowsJob *const R = &J->rows;
    const int ls = s - S->r0;
    const int64_t t = S->tt[ls];
    if (t >= R->len[s]) {
        stop_row(J, S, s, writes);
        return;
    }
    if (R->pairs && t > 0 && t % R->check_every == 0) {
        const float r = pair_residual(R->K, state_buf(R->H, R->Hb, t), s, R->P, R->dp);
        if (writes) R->residual[s] = r;
        if (r <= R->stop_ratio) {
            stop_row(J, S, s, writes);
            return;
        }
    }
    symq_push(&S->q, ls, R->ids[R->start[s] + t]);
}

/* Between rounds: stop the rows whose readout last round found them diverged, queue the others
 * of last round (or stop them), then take this round's queues and lay their rows out in groups.
 * Only thread 0 writes the shared outputs when split by columns (the others reach the same
 * decisions). */
static void sched_round(StreamsJob *J, Sched *S, int64_t round, int tid, int writes) {
    RowsJob *const R = &J->rows;
    const int P = R->P;
    if (round > 0) { /* divergences recorded during the previous round: by every thread when split by
                      * columns (the barrier orders them), by this thread alone when split by rows
                      * (its rows are its own, and nothing orders the other threads' lists) */
        const int par = (int)((round - 1) & 1);
        const int q0 = J->split_cols ? 0 : tid, q1 = J->split_cols ? R->nt : tid + 1;
        for (int q = q0; q < q1; q++)
            for (int k = 0; k < J->div_n[par][q]; k++) {
                const int64_t s = J->div_list[par][q][2 * k];
                if (s >= S->r0 && s < S->r1) {
                    if (writes) R->diverged[s] = J->div_list[par][q][2 * k + 1];
                    if (!S->stopped[s - S->r0]) stop_row(J, S, (int)s, writes);
                }
            }
    }
    for (int a = 0; a < S->n_prev; a++) {
        const int s = S->prev[a];
        if (!S->stopped[s - S->r0]) enqueue_row(J, S, s, writes);
    }
    S->n_prev = 0;
    S->n_rows = 0;
    S->n_grp = 0;
    if (S->live == 0) return;
    const int thr = symq_threshold(&S->q, J->split_cols ? 0.0f : R->frac);
    int p = 0;
    for (int x = 0; x < R->nsym; x++) {
        if (S->q.cnt[x] < thr) continue;
        S->grp_sym[S->n_grp] = x;
        S->grp_start[S->n_grp++] = p;
        const int a0 = S->n_rows;
        S->n_rows += symq_take(&S->q, x, S->r0, S->rows + a0);
        for (int a = a0; a < S->n_rows; a++) {
            const int s = S->rows[a];
            const int64_t t = S->tt[s - S->r0];
            const float *cur = state_buf(R->H, R->Hb, t);
            float *nxt = state_buf(R->H, R->Hb, t + 1);
            S->Aptr[p] = cur + (size_t)s * R->dp;
            S->Cptr[p++] = nxt + (size_t)s * R->dp;
            if (R->pairs) {
                S->Aptr[p] = cur + (size_t)(s + P) * R->dp;
                S->Cptr[p++] = nxt + (size_t)(s + P) * R->dp;
            }
        }
    }
    S->grp_start[S->n_grp] = p;
}

void streams_set_nt(void *arg, int nt) {
    StreamsJob *J = (StreamsJob *)arg;
    RowsJob *const R = &J->rows;
    R->nt = nt;
    barrier_init(&R->bar, J->split_cols ? nt : 1);
}

void streams_work(void *arg, int tid, int nt) {
    StreamsJob *J = (StreamsJob *)arg;
    RowsJob *const R = &J->rows;
    const Kernels *K = R->K;
    int sense = 0;
    const int dp = R->dp, kd = R->kd, Vp = R->Vp, V = R->V, P = R->P;
    const int cols = J->split_cols;
    Sched S;
    S.r0 = cols ? 0 : (int)((int64_t)P * tid / nt);
    S.r1 = cols ? P : (int)((int64_t)P * (tid + 1) / nt);
    const int nr = S.r1 - S.r0, rows = R->pairs ? 2 * nr : nr;
    /* output columns: h needs the first d (rounded up to a vector; column d, the homogeneous
     * coordinate, and the padding after it never change, so both buffers hold them from the
     * start). Split by columns, this thread's slice of them, in whole vectors. */
    const int VLk = K->vl, jmax = (R->d + VLk - 1) / VLk * VLk;
    const int blocks = jmax / VLk;
    const int j0 = cols ? VLk * (blocks * tid / nt) : 0, j1 = cols ? VLk * (blocks * (tid + 1) / nt) : jmax;
    const int writes = !cols || tid == 0;
    S.tt = (int64_t *)calloc(nr + 1, sizeof(int64_t));
    S.stopped = (char *)calloc(nr + 1, 1);
    const int q_ok = symq_init(&S.q, R->nsym, nr);
    S.prev = (int *)malloc(sizeof(int) * (nr + 1));
    S.rows = (int *)malloc(sizeof(int) * (nr + 1));
    S.grp_sym = (int *)malloc(sizeof(int) * (R->nsym + 1));
    S.grp_start = (int *)malloc(sizeof(int) * (R->nsym + 1));
    S.Aptr = (const float **)malloc(sizeof(float *) * (rows + 1));
    S.Cptr = (float **)malloc(sizeof(float *) * (rows + 1));
    float *scr = (float *)aligned_alloc(64, sizeof(float) * 64 * Vp);
    float *sp[64];
    const float *ap[64];
    int64_t *dl[2] = {(int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1)), (int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1))};
    int ok = S.tt && S.stopped && q_ok && S.prev && S.rows && S.grp_sym && S.grp_start &&
             S.Aptr && S.Cptr && scr && dl[0] && dl[1] && R->fault_tid != tid;
    if (!ok) atomic_store(&R->fail, 1);
    J->div_list[0][tid] = dl[0];
    J->div_list[1][tid] = dl[1];
    J->div_n[0][tid] = J->div_n[1][tid] = 0;
    R->total_steps[tid] = 0;
    /* split by columns: every thread's lists exist, and every thread stops if one has no memory
     * (split by rows the barrier is one thread's: each runs its rows if its own memory is there) */
    if (!barrier_wait_any(&R->bar, &sense, !ok)) {
        for (int i = 0; i < 64; i++) sp[i] = scr + (size_t)i * Vp;
        /* every row starts as if stepped last round (with no divergence), so the first schedule
         * queues it or stops it (no characters) */
        for (int s = S.r0; s < S.r1; s++) S.prev[s - S.r0] = s;
        S.n_prev = nr;
        S.live = nr;
        for (int64_t round = 0;; round++) {
            sched_round(J, &S, round, tid, writes);
            if (S.live == 0) break;
            const int n = S.n_rows;
            const int par = (int)(round & 1);
            J->div_n[par][tid] = 0;
            /* range check and readout of this thread's share of the round's true rows */
            const int a0 = cols ? (int)((int64_t)n * tid / nt) : 0, a1 = cols ? (int)((int64_t)n * (tid + 1) / nt) : n;
            for (int b0 = a0; b0 < a1; b0 += 64) {
                const int nb = a1 - b0 < 64 ? a1 - b0 : 64;
                for (int i = 0; i < nb; i++) {
                    const int s = S.rows[b0 + i];
                    ap[i] = state_buf(R->H, R->Hb, S.tt[s - S.r0]) + (size_t)s * dp;
                }
                double bl[64];
                if (R->bits) {
                    K->gemm_rows(nb, ap, R->RoT, kd, 0, Vp, sp);
                    for (int i = 0; i < nb; i++) {
                        const int s = S.rows[b0 + i];
                        const int64_t pos = R->start[s] + S.tt[s - S.r0];
                        bl[i] = K->lse_bits(sp[i], V, Vp, R->ids[pos]);
                        R->bits[pos] = bl[i];
                    }
                }
                for (int i = 0; i < nb; i++) {
                    if (!K->row_ok(ap[i], dp, R->limit) || (R->bits && !isfinite(bl[i]))) {
                        const int k = J->div_n[par][tid]++;
                        const int s = S.rows[b0 + i];
                        dl[par][2 * k] = s;
                        dl[par][2 * k + 1] = S.tt[s - S.r0];
                    }
                }
            }
            /* the step: this thread's columns of every group. Split by rows, the matrix of the longest
             * queue left (the likely next round) is prefetched towards L2 meanwhile */
            if (j1 > j0) {
                const void *pf = NULL;
                const int x2 = cols ? -1 : symq_longest(&S.q);
                if (x2 >= 0) pf = J->WT + (size_t)x2 * dp * kd;
                for (int g = 0; g < S.n_grp; g++) {
                    const int g0 = S.grp_start[g], g1 = S.grp_start[g + 1];
                    K->gemm_rows_pf(g1 - g0, S.Aptr + g0, J->WT + (size_t)S.grp_sym[g] * dp * kd, kd, j0, j1,
                                    S.Cptr + g0, g == S.n_grp - 1 ? pf : NULL, sizeof(float) * (size_t)dp * kd);
                }
            }
            for (int a = 0; a < n; a++) {
                S.tt[S.rows[a] - S.r0]++;
                S.prev[a] = S.rows[a];
            }
            S.n_prev = n;
            if (writes) R->total_steps[tid] += n;
            barrier_wait(&R->bar, &sense); /* no flag: the next schedule decides (see sched_round) */
        }
    }
    barrier_wait(&R->bar, &sense); /* nobody frees a divergence list another may still read */
    free(S.tt); free(S.stopped); symq_free(&S.q); free(S.prev); free(S.rows);
    free(S.grp_sym); free(S.grp_start); free(S.Aptr); free(S.Cptr); free(scr);
    free(dl[0]); free(dl[1]);
}