/* What a kernel is given: the jobs that bindings.c fills and the kernels (streams.c, jumps.c, seq.c)
 * run. */
#ifndef ISAN_JOBS_H
#define ISAN_JOBS_H

#include "native.h"
#include "queues.h"
#include "team.h"

/* What every rows kernel shares (run_streams, run_jumps): the rows and their texts, the states
 * and outputs, the correction's pairs, the team, and what the rows scheduler (rows.c) keeps
 * between threads. It opens StreamsJob and JumpsJob (as mamba's SSMParamsBase opens each kernel's
 * params), and bindings.c checks, fills and runs it in one place for both. Positions, steps and
 * divergences are counted in characters. */
typedef struct {
    const Kernels *K;
    const float *RoT;   /* (kd, Vp) the readout [W_ro | b_ro] transposed, in panels of 16 columns */
    int nsym, V, Vp, d, dp, kd;
    int P;          /* true rows: 0..P-1 */
    int pairs;      /* 1: rows P..2P-1 are error rows paired with 0..P-1 */
    float frac;     /* split by rows, a round takes the queues at least this share of the longest */
    int split_cols; /* 1: split by columns (run_streams only), 0: by rows */
    const int32_t *ids;
    const int64_t *start, *len; /* row s reads ids[start[s] : start[s] + len[s]] */
    float *H, *Hb;  /* (rows, dp) state rows (in: initial, out: final) and scratch of the same shape */
    double *bits;   /* NULL: no readout */
    float stop_ratio; /* pairs: stop once max|e| <= stop_ratio * max(1, max|h|) */
    int check_every;  /* pairs: the error is checked every check_every steps (run_jumps: jumps) */
    float limit;      /* the largest |h_i| accepted */
    int64_t *steps_done; /* (P,) */
    float *residual;     /* (P,) */
    int64_t *diverged;   /* (P,) step t at which the state before character t is out of range; -1 */
    /* set by the kernel's set_nt for the scheduler: */
    int nkeys;      /* the keys rows wait on: symbols (run_streams) or table entries (run_jumps) */
    int scratch_w;  /* floats of each of the 64 scratch rows a thread's step needs (at least Vp) */
    int nt;
    Barrier bar;
    int64_t total_steps[64]; /* per thread: characters */
    int64_t jumps[64];       /* per thread: row steps (run_jumps: jumps; run_streams: total_steps) */
    /* divergences found in a round's readouts, per round parity and thread: (row, step) pairs */
    int64_t *div_list[2][64];
    int div_n[2][64];
    atomic_int fail; /* allocation failure in a thread */
    int fault_tid;   /* test hook: this thread fails its allocations (-1: none) */
} RowsJob;

/* run_streams (streams.c): one character a step, the rows grouped by symbol. */
typedef struct {
    RowsJob rows;   /* first: a StreamsJob is a RowsJob */
    const float *WT; /* (nsym, kd, dp) [[W[x], b[x]], [0, 1]] transposed, in panels */
} StreamsJob;

/* run_jumps (jumps.c): composed jumps of a trie table's keys, the rows grouped by key. */
typedef struct {
    RowsJob rows;   /* first: a JumpsJob is a RowsJob */
    const float *M;
    int f16; /* M holds IEEE halves (uint16) */
    const int64_t *m_off;
    const int32_t *klen, *children, *entry_of;
    int n_ent, n_nodes, max_k;
} JumpsJob;

/* seq_composed (seq.c): one stream through the table. Returns the index of the first jump whose
 * resulting state is out of range (or whose bits are not finite), or -1.
 */
typedef struct {
    const Kernels *K;
    const void *Ac, *R;
    int f16;
    const int64_t *offsets, *lengths, *entries;
    int64_t n_matches;
    const int32_t *ids;
    int d, V, kd, max_len;
    float *h;     /* (kd + 16,) in/out: [h; 1; 0...] */
    double *bits; /* NULL: ingest only */
    float limit;
    /* shared while running */
    int nt;
    Barrier bar;
    float *hb[2];          /* the state before / after the current jump (kd + 16 floats each) */
    atomic_llong bad;      /* the match at which every thread stopped (a state out of range or bits not finite), or -1 */
    atomic_int fail;
    int fault_tid;         /* test hook: this thread fails its allocation (-1: none) */
} SeqJob;

/* The kernels: set_nt(job, n) once the team's size is known, then work(job, tid, nt) in every
 * thread of it (team.h's run_parallel). */
void streams_set_nt(void *arg, int nt);
void streams_work(void *arg, int tid, int nt);
void jumps_set_nt(void *arg, int nt);
void jumps_work(void *arg, int tid, int nt);
void seq_set_nt(void *arg, int nt);
void seq_work(void *arg, int tid, int nt);

#endif
