/* The rows scheduler of run_streams and run_jumps: see rows.h. */
#include "rows.h"

/* The buffer that holds a row's state after `steps` updates: H when even, Hb when odd. */
static inline float *state_buf(float *H, float *Hb, int64_t steps) { return (steps & 1) ? Hb : H; }

/* Row s stops: its steps done, and its final state (and its error row's, with pairs) to H. */
static void stop_row(RowSched *S, int s) {
    RowsJob *const R = S->R;
    const int ls = s - S->r0;
    S->stopped[ls] = 1;
    S->live--;
    if (!S->writes) return;
    R->steps_done[s] = S->pos[ls] < R->len[s] ? S->pos[ls] : R->len[s];
    if (S->nstep[ls] & 1) {
        memcpy(R->H + (size_t)s * R->dp, R->Hb + (size_t)s * R->dp, sizeof(float) * R->dp);
        if (R->pairs)
            memcpy(R->H + ((size_t)s + R->P) * R->dp, R->Hb + ((size_t)s + R->P) * R->dp, sizeof(float) * R->dp);
    }
}

/* A row that has not stopped: stop it if it is at its end or (pairs, every check_every steps) its
 * error is small against its state (max|e| / max|h| over the whole rows: the homogeneous 1 floors
 * max|h| at 1, the error row has 0 there), else put it in the queue of its next key. */
static void enqueue_row(const RowsOps *ops, void *job, RowSched *S, int s) {
    RowsJob *const R = S->R;
    const int ls = s - S->r0;
    const int64_t t = S->nstep[ls];
    if (S->pos[ls] >= R->len[s]) {
        stop_row(S, s);
        return;
    }
    if (R->pairs && t > 0 && t % R->check_every == 0) {
        const float *buf = state_buf(R->H, R->Hb, t);
        const float r = R->K->row_absmax(buf + ((size_t)s + R->P) * R->dp, R->dp) /
                        R->K->row_absmax(buf + (size_t)s * R->dp, R->dp);
        if (S->writes) R->residual[s] = r;
        if (r <= R->stop_ratio) {
            stop_row(S, s);
            return;
        }
    }
    S->key[ls] = ops->key(job, s, S->pos[ls], &S->chars[ls]);
    symq_push(&S->q, ls, S->key[ls]);
}

/* Between rounds: stop the rows whose readout last round found them diverged (the lists of every
 * thread when split by columns: the barrier orders them; this thread's alone when split by rows:
 * its rows are its own, and nothing orders the other threads' lists), queue the others of last
 * round (or stop them), then take this round's queues and lay their rows out in groups. */
static void schedule(const RowsOps *ops, void *job, RowSched *S, int64_t round) {
    RowsJob *const R = S->R;
    const int P = R->P, dp = R->dp;
    if (round > 0) {
        const int par = (int)((round - 1) & 1);
        const int q0 = R->split_cols ? 0 : S->tid, q1 = R->split_cols ? R->nt : S->tid + 1;
        for (int q = q0; q < q1; q++)
            for (int k = 0; k < R->div_n[par][q]; k++) {
                const int64_t s = R->div_list[par][q][2 * k];
                if (s >= S->r0 && s < S->r1 && !S->stopped[s - S->r0]) {
                    if (S->writes) R->diverged[s] = R->div_list[par][q][2 * k + 1];
                    stop_row(S, (int)s);
                }
            }
    }
    for (int a = 0; a < S->n_prev; a++) {
        const int s = S->prev[a];
        if (!S->stopped[s - S->r0]) enqueue_row(ops, job, S, s);
    }
    S->n_prev = 0;
    S->n_rows = 0;
    S->n_grp = 0;
    if (S->live == 0) return;
    const int thr = symq_threshold(&S->q, R->split_cols ? 0.0f : R->frac);
    int p = 0;
    for (int x = 0; x < R->nkeys; x++) {
        if (S->q.cnt[x] < thr) continue;
        S->grp_key[S->n_grp] = x;
        S->grp_start[S->n_grp++] = S->n_rows;
        const int a0 = S->n_rows;
        S->n_rows += symq_take(&S->q, x, S->r0, S->rows + a0);
        for (int a = a0; a < S->n_rows; a++) {
            const int s = S->rows[a];
            const int64_t t = S->nstep[s - S->r0];
            const float *cur = state_buf(R->H, R->Hb, t);
            float *nxt = state_buf(R->H, R->Hb, t + 1);
            S->Ar[a] = cur + (size_t)s * dp;
            S->A[p] = cur + (size_t)s * dp;
            S->C[p++] = nxt + (size_t)s * dp;
            if (R->pairs) {
                S->A[p] = cur + (size_t)(s + P) * dp;
                S->C[p++] = nxt + (size_t)(s + P) * dp;
            }
        }
    }
    S->grp_start[S->n_grp] = S->n_rows;
}

/* The readout before the step of rows [a0, a1) of this round, with the range check: bits of the
 * character each reads next, and a divergence where the state is out of range or the bits are not
 * finite. */
static void readout(RowSched *S, int a0, int a1) {
    RowsJob *const R = S->R;
    const Kernels *K = R->K;
    float *sp[64];
    for (int i = 0; i < 64; i++) sp[i] = S->scr + (size_t)i * R->Vp;
    for (int b0 = a0; b0 < a1; b0 += 64) {
        const int nb = a1 - b0 < 64 ? a1 - b0 : 64;
        if (R->bits) K->gemm_rows(nb, S->Ar + b0, R->RoT, R->kd, 0, R->Vp, sp);
        for (int i = 0; i < nb; i++) {
            const int s = S->rows[b0 + i], ls = s - S->r0;
            double b = 0.0;
            if (R->bits) {
                const int64_t p = R->start[s] + S->pos[ls];
                b = K->lse_bits(sp[i], R->V, R->Vp, R->ids[p]);
                R->bits[p] = b;
            }
            if (!K->row_ok(S->Ar[b0 + i], R->dp, R->limit) || !isfinite(b)) rows_diverged(S, s, S->pos[ls]);
        }
    }
}

void rows_set_nt(RowsJob *R, int nt) {
    R->nt = nt;
    barrier_init(&R->bar, R->split_cols ? nt : 1);
}

/* The rounds of one thread: schedule, readout, the groups' steps, until no row is live. */
static void run_rounds(RowsJob *R, const RowsOps *ops, void *job, RowSched *S, int *sense, int j0, int j1) {
    const int tid = S->tid, nt = R->nt, cols = R->split_cols;
    /* every row starts as if stepped last round (with no divergence), so the first schedule
     * queues it or stops it (no characters) */
    for (int s = S->r0; s < S->r1; s++) S->prev[s - S->r0] = s;
    S->n_prev = S->nr;
    S->live = S->nr;
    for (int64_t round = 0;; round++) {
        schedule(ops, job, S, round);
        if (S->live == 0) break;
        const int n = S->n_rows;
        S->par = (int)(round & 1);
        R->div_n[S->par][tid] = 0;
        if (ops->prepare) ops->prepare(job, S);
        /* this thread's share of the round's rows (all of them split by rows) */
        readout(S, cols ? (int)((int64_t)n * tid / nt) : 0, cols ? (int)((int64_t)n * (tid + 1) / nt) : n);
        for (int g = 0; g < S->n_grp; g++) ops->step(job, S, g, j0, j1);
        int64_t chars = 0;
        for (int a = 0; a < n; a++) {
            const int ls = S->rows[a] - S->r0;
            S->nstep[ls]++;
            S->pos[ls] += S->chars[ls];
            chars += S->chars[ls];
            S->prev[a] = S->rows[a];
        }
        S->n_prev = n;
        if (S->writes) {
            R->total_steps[tid] += chars;
            R->jumps[tid] += n;
        }
        barrier_wait(&R->bar, sense); /* no flag: the next schedule decides (see schedule) */
    }
}

void rows_work(RowsJob *R, const RowsOps *ops, void *job, int tid, int nt) {
    const int cols = R->split_cols;
    int sense = 0;
    RowSched S = {.R = R, .tid = tid, .writes = !cols || tid == 0};
    S.r0 = cols ? 0 : (int)((int64_t)R->P * tid / nt);
    S.r1 = cols ? R->P : (int)((int64_t)R->P * (tid + 1) / nt);
    const int nr = S.nr = S.r1 - S.r0, steprows = R->pairs ? 2 * nr : nr;
    /* output columns: h needs the first d (rounded up to a vector; column d, the homogeneous
     * coordinate, and the padding after it never change, so both buffers hold them from the
     * start). Split by columns, this thread's slice of them, in whole vectors. */
    const int VLk = R->K->vl, jmax = (R->d + VLk - 1) / VLk * VLk, blocks = jmax / VLk;
    const int j0 = cols ? VLk * (blocks * tid / nt) : 0, j1 = cols ? VLk * (blocks * (tid + 1) / nt) : jmax;
    const int sw = R->scratch_w > R->Vp ? R->scratch_w : R->Vp;
    S.nstep = (int64_t *)calloc(nr + 1, sizeof(int64_t));
    S.pos = (int64_t *)calloc(nr + 1, sizeof(int64_t));
    S.key = (int *)malloc(sizeof(int) * (nr + 1));
    S.chars = (int *)malloc(sizeof(int) * (nr + 1));
    S.stopped = (char *)calloc(nr + 1, 1);
    S.listed = (char *)calloc(nr + 1, 1);
    const int q_ok = symq_init(&S.q, R->nkeys, nr);
    S.prev = (int *)malloc(sizeof(int) * (nr + 1));
    S.rows = (int *)malloc(sizeof(int) * (nr + 1));
    S.Ar = (const float **)malloc(sizeof(float *) * (nr + 1));
    S.A = (const float **)malloc(sizeof(float *) * (steprows + 1));
    S.C = (float **)malloc(sizeof(float *) * (steprows + 1));
    S.grp_key = (int *)malloc(sizeof(int) * (R->nkeys + 1));
    S.grp_start = (int *)malloc(sizeof(int) * (R->nkeys + 1));
    S.scr = (float *)aligned_alloc(64, sizeof(float) * 64 * (size_t)sw);
    S.dl[0] = (int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1));
    S.dl[1] = (int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1));
    const int ok = S.nstep && S.pos && S.key && S.chars && S.stopped && S.listed && q_ok && S.prev && S.rows &&
                   S.Ar && S.A && S.C && S.grp_key && S.grp_start && S.scr && S.dl[0] && S.dl[1] &&
                   R->fault_tid != tid;
    if (!ok) atomic_store(&R->fail, 1);
    R->div_list[0][tid] = S.dl[0];
    R->div_list[1][tid] = S.dl[1];
    R->div_n[0][tid] = R->div_n[1][tid] = 0;
    R->total_steps[tid] = 0;
    R->jumps[tid] = 0;
    /* split by columns: every thread's lists exist, and every thread stops if one has no memory
     * (split by rows the barrier is one thread's: each runs its rows if its own memory is there) */
    if (!barrier_wait_any(&R->bar, &sense, !ok)) run_rounds(R, ops, job, &S, &sense, j0, j1);
    barrier_wait(&R->bar, &sense); /* nobody frees a divergence list another may still read */
    free(S.nstep); free(S.pos); free(S.key); free(S.chars); free(S.stopped); free(S.listed); symq_free(&S.q);
    free(S.prev); free(S.rows); free(S.Ar); free(S.A); free(S.C); free(S.grp_key); free(S.grp_start);
    free(S.scr); free(S.dl[0]); free(S.dl[1]);
}
