/* The rows scheduler (rows.c): the one schedule of run_streams and run_jumps. A kernel gives only
 * what differs between them (RowsOps): the key a row waits on next and the step of a group of rows
 * that wait on one key; everything else is here.
 *
 * Rows are independent, so they need not move in step. Each row waits in the queue of its next
 * key (a symbol, or the table entry of its greedy longest match) with its own count of steps;
 * a round takes the queues that are at least `frac` of the longest (split by columns: every
 * non-empty queue), reads their rows out and steps them, one group a key. A rare key's matrix is
 * then read once for the rows that have gathered on it instead of every round for one or two. The
 * order of the steps does not change any row's arithmetic (a row's product is the same whatever
 * group it is in), so the bits are those of the in-step schedule, bit for bit.
 *
 * Between rounds a row that was stepped stops when it diverged (its readout found its state out
 * of range or its bits not finite: recorded one way, rows_diverged), finished (no characters left)
 * or, with pairs, converged (every check_every steps, its error small against its state); its
 * final state goes to H. The others join the queue of their next key.
 *
 * Two ways to share the work among threads:
 *   split by rows: each thread owns a contiguous block of rows and runs them alone, no barrier;
 *   split by columns (run_streams): every thread schedules all rows; in each round it computes its
 *     own slice of output columns of every group and the readouts of its share of the rows; one
 *     barrier a round. Divergences go through lists per round parity and thread, read by every
 *     thread after the barrier, so all threads reach the same schedule from the same data (only
 *     thread 0 writes the shared outputs).
 */
#ifndef ISAN_ROWS_H
#define ISAN_ROWS_H

#include "jobs.h"

/* One thread's schedule; rows indexed from r0 (local index ls = s - r0). */
typedef struct RowSched {
    RowsJob *R;
    int tid, writes; /* writes: this thread writes the shared outputs (split by columns: thread 0 alone) */
    int r0, r1, nr;  /* rows this thread schedules (all rows when split by columns) */
    int64_t *nstep;  /* steps each row has taken: its state is in H when even, in Hb when odd */
    int64_t *pos;    /* characters each row has read */
    int *key, *chars; /* a queued row's next key and the characters its step reads */
    char *stopped, *listed; /* listed: a divergence of the row is recorded */
    SymQueues q;     /* the rows waiting, by key */
    int *prev, n_prev; /* the rows stepped in the last round (true rows) */
    int *rows, n_rows; /* this round's true rows, grouped by key */
    const float **Ar;  /* (n_rows) their states before the step (the readouts' rows) */
    const float **A;   /* the step's rows: with pairs each row then its error row (2 n_rows) */
    float **C;         /* where the step writes them */
    int *grp_key, *grp_start, n_grp; /* this round's groups: key and first row (n_grp + 1 starts) */
    int live;          /* rows not stopped */
    int par;           /* this round's parity (its divergence list) */
    float *scr;        /* 64 scratch rows of R->scratch_w floats (the readouts' logits) */
    int64_t *dl[2];    /* this thread's divergence lists, per round parity */
} RowSched;

/* What differs between the rows kernels; job is the kernel's job (its RowsJob first). */
typedef struct {
    /* the key row s waits on next, read from its position pos < len[s]; *chars: what its step reads */
    int (*key)(void *job, int s, int64_t pos, int *chars);
    /* after a round's schedule, before its readout (NULL: nothing) */
    void (*prepare)(void *job, const RowSched *S);
    /* the step of group g: its rows' next states (output columns [j0, j1) of each) and any
     * readouts inside the step (their divergences through rows_diverged) */
    void (*step)(void *job, RowSched *S, int g, int j0, int j1);
} RowsOps;

/* Row s's readout found it diverged at character `at` of its text: recorded once (the first), the
 * row stops at the next schedule. */
static inline void rows_diverged(RowSched *S, int s, int64_t at) {
    const int ls = s - S->r0;
    if (S->listed[ls]) return;
    S->listed[ls] = 1;
    const int k = S->R->div_n[S->par][S->tid]++;
    S->dl[S->par][2 * k] = s;
    S->dl[S->par][2 * k + 1] = at;
}

/* Group g's step rows: [*p0, *p1) of S->A and S->C (each row then its error row with pairs). */
static inline void rows_group(const RowSched *S, int g, int *p0, int *p1) {
    const int m = S->R->pairs ? 2 : 1;
    *p0 = m * S->grp_start[g];
    *p1 = m * S->grp_start[g + 1];
}

/* The key after group g: the next group's, or after the last the longest queue left (the likely
 * next round; -1 when none): what a step prefetches. */
static inline int rows_next_key(const RowSched *S, int g) {
    return g + 1 < S->n_grp ? S->grp_key[g + 1] : symq_longest(&S->q);
}

/* The team's size is known (a kernel's set_nt calls it once nkeys and scratch_w are set). */
void rows_set_nt(RowsJob *R, int nt);

/* A thread's whole run: allocate, schedule, read out, step, stop, free. */
void rows_work(RowsJob *R, const RowsOps *ops, void *job, int tid, int nt);

#endif
