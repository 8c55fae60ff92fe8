/* run_streams: many state rows advanced one character a step, grouped by symbol (native.h). The
 * schedule, the stops and the readout are the rows scheduler's (rows.h); here only the key a row
 * waits on (the symbol it reads next) and the step of a group: row <- row @ WT[x], in this
 * thread's columns (all of them split by rows; a slice split by columns, one barrier a round:
 * best when rows are few, every group as large as it can be and each thread reading only its
 * slice of each matrix).
 */
#include "rows.h"

static int streams_key(void *job, int s, int64_t pos, int *chars) {
    const RowsJob *R = &((StreamsJob *)job)->rows;
    *chars = 1;
    return R->ids[R->start[s] + pos];
}

/* Group g: its symbol's matrix for all its rows (and their error rows). Split by rows, the matrix
 * of the longest queue left (the likely next round) is prefetched towards L2 during the last group. */
static void streams_step(void *job, RowSched *S, int g, int j0, int j1) {
    const StreamsJob *J = (const StreamsJob *)job;
    const RowsJob *R = &J->rows;
    if (j1 <= j0) return;
    const size_t msz = (size_t)R->dp * R->kd;
    const void *pf = NULL;
    if (g == S->n_grp - 1 && !R->split_cols) {
        const int x2 = symq_longest(&S->q);
        if (x2 >= 0) pf = J->WT + (size_t)x2 * msz;
    }
    int p0, p1;
    rows_group(S, g, &p0, &p1);
    R->K->gemm_rows_pf(p1 - p0, S->A + p0, J->WT + (size_t)S->grp_key[g] * msz, R->kd, j0, j1, S->C + p0, pf,
                       sizeof(float) * msz);
}

static const RowsOps STREAMS_OPS = {.key = streams_key, .prepare = NULL, .step = streams_step};

void streams_set_nt(void *arg, int nt) {
    RowsJob *R = &((StreamsJob *)arg)->rows;
    R->nkeys = R->nsym;
    R->scratch_w = R->Vp;
    rows_set_nt(R, nt);
}

void streams_work(void *arg, int tid, int nt) { rows_work(&((StreamsJob *)arg)->rows, &STREAMS_OPS, arg, tid, nt); }
