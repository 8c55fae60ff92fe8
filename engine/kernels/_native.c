/* isan.engine.kernels._native: the compiled hot loops of the engine.
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
 * and the best one the CPU supports is chosen when the module loads (isa() tells which).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
    const char *name;
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

/* ---- the portable baseline ---- */
#define SFX(name) name##_generic
#define VL 4
#define MR 4
#define NVM 2
#define HAVE_F16C 0
#define KERNEL_NAME "generic"
#include "kern_impl.h"
#undef SFX
#undef VL
#undef MR
#undef NVM
#undef HAVE_F16C
#undef KERNEL_NAME

#if ISAN_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define SFX(name) name##_avx2
#define VL 8
#define MR 3
#define NVM 4
#define HAVE_F16C 1
#define KERNEL_NAME "avx2"
#include "kern_impl.h"
#undef SFX
#undef VL
#undef MR
#undef NVM
#undef HAVE_F16C
#undef KERNEL_NAME
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma,f16c")
#define SFX(name) name##_avx512
#define VL 16
/* 14 rows x 2 vectors (28 of the 32 registers accumulate): a tile reads a 2-vector panel of B
 * (217 x 32 floats, 28 KB: stays in L1) against 6 x 4 before; long text 2.36M chars/s against
 * 2.08M (development runs of each build, two threads, 5 repeats, on a machine whose speed drifted
 * by 10%; 8 x 3: 2.29M) */
#define MR 14
#define NVM 2
#define HAVE_F16C 1
#define KERNEL_NAME "avx512"
#include "kern_impl.h"
#undef SFX
#undef VL
#undef MR
#undef NVM
#undef HAVE_F16C
#undef KERNEL_NAME
#pragma GCC pop_options
#endif

static const Kernels *KERN = &kernels_generic;

static const Kernels *choose_kernels(const char *want) {
    if (want && strcmp(want, "generic") == 0) return &kernels_generic;
#if ISAN_X86
    __builtin_cpu_init();
    const int has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
    const int has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    if (want && strcmp(want, "avx2") == 0) return has_avx2 ? &kernels_avx2 : NULL;
    if (want && strcmp(want, "avx512") == 0) return has_avx512 ? &kernels_avx512 : NULL;
    if (want && *want) return NULL;
    if (has_avx512) return &kernels_avx512;
    if (has_avx2) return &kernels_avx2;
#else
    if (want && *want) return NULL;
#endif
    return &kernels_generic;
}

/* ------------------------------------------------------------------------------------------
 * Threads: a parallel region is nt threads (the caller is thread 0), created for the call and
 * joined before it returns, so no thread and no team state outlives a call: a call that stops
 * early (a diverging state, an allocation failure) leaves nothing behind for the next one.
 *
 * Inside a region, a sense-reversing barrier that spins briefly, then yields, then sleeps on a
 * condition variable (the machine may be shared: a waiter must not hold a core that the thread
 * it waits for needs). Every thread must leave a loop at the same phase, so every decision to
 * leave is taken either by the barrier itself (barrier_wait_any: did any thread raise its flag in
 * this phase?) or from data that no thread writes again before the next barrier (run_streams
 * split by columns: every thread reaches the same schedule from the same rows). Reading a flag
 * that threads set while they work is not enough: a faster thread may already be in the next
 * phase and set it there, the threads then leave the loop at different phases, and one of them
 * waits forever at a barrier the others never reach (issue 20: seq_composed hung that way on a
 * diverging text, every time once other processes held the cores).
 * ------------------------------------------------------------------------------------------ */
typedef struct {
    atomic_int count;   /* arrivals in the current phase */
    atomic_int sense;   /* flips when a phase completes */
    atomic_int any[2];  /* per phase parity: did any thread raise its flag (see barrier_wait_any) */
    atomic_int sleepers;
    int n;
    int can_sleep;      /* mu and cv are initialised */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Barrier;

#define BARRIER_SPINS 20000 /* pause instructions before yielding (about 1 ms) */
#define BARRIER_YIELDS 64   /* sched_yield calls before sleeping */

static void barrier_init(Barrier *b, int n) {
    atomic_init(&b->count, 0);
    atomic_init(&b->sense, 0);
    atomic_init(&b->any[0], 0);
    atomic_init(&b->any[1], 0);
    atomic_init(&b->sleepers, 0);
    b->n = n;
    b->can_sleep = 0;
    if (n > 1 && pthread_mutex_init(&b->mu, NULL) == 0) {
        if (pthread_cond_init(&b->cv, NULL) == 0) b->can_sleep = 1;
        else pthread_mutex_destroy(&b->mu);
    } /* else: waiters spin and yield only */
}

/* After the region has been joined (no thread is inside a barrier any more). */
static void barrier_destroy(Barrier *b) {
    if (b->can_sleep) {
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        b->can_sleep = 0;
    }
}

/* Wait until all b->n threads have arrived; returns 1 if any of them passed flag != 0 in this
 * phase, the same answer in every thread. Memory: everything a thread wrote before arriving is
 * visible to every thread after it leaves (release by the arrivals' fetch_add, acquire by the
 * last arrival; release by the sense store, acquire by the waiters' loads).
 *
 * any[] alternates between phases: the flags of this phase go to any[s] (s the new sense); the
 * last arrival clears any[!s], the slot of the previous phase, which every thread has read
 * (each reads its result before it arrives here) and no thread writes again before the next
 * phase, which cannot start until this one completes. */
static int barrier_wait_any(Barrier *b, int *local_sense, int flag) {
    if (b->n <= 1) return flag != 0;
    const int s = !*local_sense;
    *local_sense = s;
    if (flag) atomic_fetch_or_explicit(&b->any[s], 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == b->n - 1) {
        atomic_store_explicit(&b->any[!s], 0, memory_order_relaxed);
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        /* seq_cst store and load: either a sleeper's seq_cst load of sense (below) sees the new
         * sense, or this load sees that sleeper counted, and then it is woken under the mutex */
        atomic_store_explicit(&b->sense, s, memory_order_seq_cst);
        if (b->can_sleep && atomic_load_explicit(&b->sleepers, memory_order_seq_cst) > 0) {
            pthread_mutex_lock(&b->mu);
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->mu);
        }
    } else {
        int spins = 0;
        while (atomic_load_explicit(&b->sense, memory_order_acquire) != s) {
            if (spins < BARRIER_SPINS) {
                CPU_RELAX();
            } else if (spins < BARRIER_SPINS + BARRIER_YIELDS || !b->can_sleep) {
                sched_yield();
            } else {
                atomic_fetch_add_explicit(&b->sleepers, 1, memory_order_seq_cst);
                pthread_mutex_lock(&b->mu);
                while (atomic_load_explicit(&b->sense, memory_order_seq_cst) != s) pthread_cond_wait(&b->cv, &b->mu);
                pthread_mutex_unlock(&b->mu);
                atomic_fetch_sub_explicit(&b->sleepers, 1, memory_order_relaxed);
                break;
            }
            if (spins < BARRIER_SPINS + BARRIER_YIELDS) spins++;
        }
    }
    return atomic_load_explicit(&b->any[s], memory_order_relaxed) != 0;
}

static void barrier_wait(Barrier *b, int *local_sense) { (void)barrier_wait_any(b, local_sense, 0); }

/* Test hooks (inject_faults): armed by Python, taken (and disarmed) by the next kernel call. */
static atomic_int fault_alloc_tid = -1; /* that thread of the next call's team fails its allocations */
static atomic_int fault_max_threads = 0; /* the next call gets at most this many threads (0: no limit) */

typedef void (*WorkFn)(void *arg, int tid, int nt);

typedef struct { /* the start of a region: workers wait until the caller knows the team's size */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, nt;
} Start;

typedef struct {
    WorkFn fn;
    void *arg;
    int tid;
    Start *start;
} ThreadArg;

static void *thread_main(void *p) {
    ThreadArg *t = (ThreadArg *)p;
    pthread_mutex_lock(&t->start->mu);
    while (!t->start->go) pthread_cond_wait(&t->start->cv, &t->start->mu);
    const int nt = t->start->nt;
    pthread_mutex_unlock(&t->start->mu);
    t->fn(t->arg, t->tid, nt);
    return NULL;
}

/* Run fn(arg, tid, nt) on up to nt threads (the caller is thread 0) and join them. Threads are
 * created first and released together once their number is known, so if the system refuses a
 * thread (or max_threads says so) the work is shared among those that exist. set_nt(arg, n) is
 * called with the final count before any work starts. Returns the count. fn must return in
 * every thread by the same path through its barriers (see barrier_wait_any). */
static int run_parallel(WorkFn fn, void *arg, int nt, void (*set_nt)(void *, int), int max_threads) {
    if (nt < 1) nt = 1;
    if (nt > 64) nt = 64;
    if (max_threads > 0 && nt > max_threads) nt = max_threads;
    pthread_t th[64];
    ThreadArg ta[64];
    Start st;
    st.go = 0;
    st.nt = 1;
    int created = 1;
    if (nt > 1 && pthread_mutex_init(&st.mu, NULL) == 0) {
        if (pthread_cond_init(&st.cv, NULL) == 0) {
            for (int t = 1; t < nt; t++) {
                ta[t] = (ThreadArg){fn, arg, t, &st};
                if (pthread_create(&th[t], NULL, thread_main, &ta[t]) != 0) break;
                created++;
            }
            set_nt(arg, created);
            pthread_mutex_lock(&st.mu);
            st.nt = created;
            st.go = 1;
            pthread_cond_broadcast(&st.cv);
            pthread_mutex_unlock(&st.mu);
            fn(arg, 0, created);
            for (int t = 1; t < created; t++) pthread_join(th[t], NULL);
            pthread_cond_destroy(&st.cv);
            pthread_mutex_destroy(&st.mu);
            return created;
        }
        pthread_mutex_destroy(&st.mu);
    }
    set_nt(arg, 1); /* one thread (asked for, or no synchronisation objects): the caller alone */
    fn(arg, 0, 1);
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * run_streams
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
 * ------------------------------------------------------------------------------------------ */

/* The rows of one thread (local indices 0..n-1) in queues: singly linked lists, taken whole. By the
 * symbol each row reads next in run_streams, by the table entry it takes next in run_jumps. */
typedef struct {
    int *head, *next, *cnt; /* (nsym,) first row (-1: empty), (n,) the row after, (nsym,) lengths */
    int nsym;
} SymQueues;

static int symq_init(SymQueues *Q, int nsym, int n) {
    Q->nsym = nsym;
    Q->head = (int *)malloc(sizeof(int) * nsym);
    Q->next = (int *)malloc(sizeof(int) * (n + 1));
    Q->cnt = (int *)calloc(nsym, sizeof(int));
    if (!Q->head || !Q->next || !Q->cnt) return 0;
    for (int x = 0; x < nsym; x++) Q->head[x] = -1;
    return 1;
}

static void symq_free(SymQueues *Q) { free(Q->head); free(Q->next); free(Q->cnt); }

static inline void symq_push(SymQueues *Q, int ls, int x) {
    Q->next[ls] = Q->head[x];
    Q->head[x] = ls;
    Q->cnt[x]++;
}

/* the longest queue (-1 when all are empty) */
static int symq_longest(const SymQueues *Q) {
    int best = -1;
    for (int x = 0; x < Q->nsym; x++)
        if (Q->cnt[x] > 0 && (best < 0 || Q->cnt[x] > Q->cnt[best])) best = x;
    return best;
}

/* the length a queue needs to be taken this round: frac of the longest, at least 1 (frac 0: every
 * non-empty queue) */
static int symq_threshold(const SymQueues *Q, float frac) {
    const int x = symq_longest(Q);
    const int thr = x < 0 ? 1 : (int)(frac * (float)Q->cnt[x]);
    return thr < 1 ? 1 : thr;
}

/* empty queue x into out[] as rows ls + r0; returns how many */
static int symq_take(SymQueues *Q, int x, int r0, int *out) {
    int n = 0;
    for (int ls = Q->head[x]; ls >= 0; ls = Q->next[ls]) out[n++] = ls + r0;
    Q->head[x] = -1;
    Q->cnt[x] = 0;
    return n;
}

/* The buffer that holds a row's state after `steps` updates: H when even, Hb when odd. */
static inline float *state_buf(float *H, float *Hb, int64_t steps) { return (steps & 1) ? Hb : H; }

/* The correction's measure of a pair (row s and its error row s + P in buf): max|e| / max|h| over
 * the whole rows (the homogeneous 1 floors max|h| at 1; the error row has 0 there). */
static inline float pair_residual(const Kernels *K, const float *buf, int s, int P, int dp) {
    return K->row_absmax(buf + ((size_t)s + P) * dp, dp) / K->row_absmax(buf + (size_t)s * dp, dp);
}

/* A row that stops with its state in Hb: copy it (and its error row's, with pairs) to H. */
static void final_to_H(float *H, const float *Hb, int s, int P, int pairs, int dp) {
    memcpy(H + (size_t)s * dp, Hb + (size_t)s * dp, sizeof(float) * dp);
    if (pairs) memcpy(H + ((size_t)s + P) * dp, Hb + ((size_t)s + P) * dp, sizeof(float) * dp);
}

typedef struct {
    const Kernels *K;
    const float *WT, *RoT;
    int nsym, V, Vp, d, dp, kd;
    int P;          /* true rows: 0..P-1 */
    int pairs;      /* 1: rows P..2P-1 are error rows paired with 0..P-1 */
    int split_cols; /* 1: split by columns, 0: by rows */
    float frac;     /* split by rows, a round takes the symbol queues at least this share of the longest */
    const int32_t *ids;
    const int64_t *start, *len;
    float *H, *Hb;  /* (rows, dp) state rows (in: initial, out: final) and scratch of the same shape */
    double *bits;   /* NULL: no readout */
    float stop_ratio; /* pairs: stop once max|e| <= stop_ratio * max(1, max|h|) */
    int check_every;
    float limit;
    int64_t *steps_done; /* (P,) */
    float *residual;     /* (P,) */
    int64_t *diverged;   /* (P,) step t at which the state before character t is out of range; -1 */
    int nt;
    Barrier bar;
    /* divergences found in a round's readouts, per round parity and thread: (row, step) pairs */
    int64_t *div_list[2][64];
    int div_n[2][64];
    int64_t total_steps[64];
    atomic_int fail; /* allocation failure in a thread */
    int fault_tid;   /* test hook: this thread fails its allocations (-1: none) */
} StreamsJob;

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
    const int64_t done = S->tt[s - S->r0];
    S->stopped[s - S->r0] = 1;
    S->live--;
    if (!writes) return;
    J->steps_done[s] = done;
    if (done & 1) final_to_H(J->H, J->Hb, s, J->P, J->pairs, J->dp);
}

/* A row that has not stopped: stop it if it is at its end or (pairs, every check_every steps) its
 * error is small, else put it in the queue of the symbol it reads next. */
static void enqueue_row(StreamsJob *J, Sched *S, int s, int writes) {
    const int ls = s - S->r0;
    const int64_t t = S->tt[ls];
    if (t >= J->len[s]) {
        stop_row(J, S, s, writes);
        return;
    }
    if (J->pairs && t > 0 && t % J->check_every == 0) {
        const float r = pair_residual(J->K, state_buf(J->H, J->Hb, t), s, J->P, J->dp);
        if (writes) J->residual[s] = r;
        if (r <= J->stop_ratio) {
            stop_row(J, S, s, writes);
            return;
        }
    }
    symq_push(&S->q, ls, J->ids[J->start[s] + t]);
}

/* Between rounds: stop the rows whose readout last round found them diverged, queue the others
 * of last round (or stop them), then take this round's queues and lay their rows out in groups.
 * Only thread 0 writes the shared outputs when split by columns (the others reach the same
 * decisions). */
static void sched_round(StreamsJob *J, Sched *S, int64_t round, int tid, int writes) {
    const int P = J->P;
    if (round > 0) { /* divergences recorded during the previous round: by every thread when split by
                      * columns (the barrier orders them), by this thread alone when split by rows
                      * (its rows are its own, and nothing orders the other threads' lists) */
        const int par = (int)((round - 1) & 1);
        const int q0 = J->split_cols ? 0 : tid, q1 = J->split_cols ? J->nt : tid + 1;
        for (int q = q0; q < q1; q++)
            for (int k = 0; k < J->div_n[par][q]; k++) {
                const int64_t s = J->div_list[par][q][2 * k];
                if (s >= S->r0 && s < S->r1) {
                    if (writes) J->diverged[s] = J->div_list[par][q][2 * k + 1];
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
    const int thr = symq_threshold(&S->q, J->split_cols ? 0.0f : J->frac);
    int p = 0;
    for (int x = 0; x < J->nsym; x++) {
        if (S->q.cnt[x] < thr) continue;
        S->grp_sym[S->n_grp] = x;
        S->grp_start[S->n_grp++] = p;
        const int a0 = S->n_rows;
        S->n_rows += symq_take(&S->q, x, S->r0, S->rows + a0);
        for (int a = a0; a < S->n_rows; a++) {
            const int s = S->rows[a];
            const int64_t t = S->tt[s - S->r0];
            const float *cur = state_buf(J->H, J->Hb, t);
            float *nxt = state_buf(J->H, J->Hb, t + 1);
            S->Aptr[p] = cur + (size_t)s * J->dp;
            S->Cptr[p++] = nxt + (size_t)s * J->dp;
            if (J->pairs) {
                S->Aptr[p] = cur + (size_t)(s + P) * J->dp;
                S->Cptr[p++] = nxt + (size_t)(s + P) * J->dp;
            }
        }
    }
    S->grp_start[S->n_grp] = p;
}

static void streams_set_nt(void *arg, int nt) {
    StreamsJob *J = (StreamsJob *)arg;
    J->nt = nt;
    barrier_init(&J->bar, J->split_cols ? nt : 1);
}

static void streams_work(void *arg, int tid, int nt) {
    StreamsJob *J = (StreamsJob *)arg;
    const Kernels *K = J->K;
    int sense = 0;
    const int dp = J->dp, kd = J->kd, Vp = J->Vp, V = J->V, P = J->P;
    const int cols = J->split_cols;
    Sched S;
    S.r0 = cols ? 0 : (int)((int64_t)P * tid / nt);
    S.r1 = cols ? P : (int)((int64_t)P * (tid + 1) / nt);
    const int nr = S.r1 - S.r0, rows = J->pairs ? 2 * nr : nr;
    /* output columns: h needs the first d (rounded up to a vector; column d, the homogeneous
     * coordinate, and the padding after it never change, so both buffers hold them from the
     * start). Split by columns, this thread's slice of them, in whole vectors. */
    const int VLk = K->vl, jmax = (J->d + VLk - 1) / VLk * VLk;
    const int blocks = jmax / VLk;
    const int j0 = cols ? VLk * (blocks * tid / nt) : 0, j1 = cols ? VLk * (blocks * (tid + 1) / nt) : jmax;
    const int writes = !cols || tid == 0;
    S.tt = (int64_t *)calloc(nr + 1, sizeof(int64_t));
    S.stopped = (char *)calloc(nr + 1, 1);
    const int q_ok = symq_init(&S.q, J->nsym, nr);
    S.prev = (int *)malloc(sizeof(int) * (nr + 1));
    S.rows = (int *)malloc(sizeof(int) * (nr + 1));
    S.grp_sym = (int *)malloc(sizeof(int) * (J->nsym + 1));
    S.grp_start = (int *)malloc(sizeof(int) * (J->nsym + 1));
    S.Aptr = (const float **)malloc(sizeof(float *) * (rows + 1));
    S.Cptr = (float **)malloc(sizeof(float *) * (rows + 1));
    float *scr = (float *)aligned_alloc(64, sizeof(float) * 64 * Vp);
    float *sp[64];
    const float *ap[64];
    int64_t *dl[2] = {(int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1)), (int64_t *)malloc(sizeof(int64_t) * 2 * (nr + 1))};
    int ok = S.tt && S.stopped && q_ok && S.prev && S.rows && S.grp_sym && S.grp_start &&
             S.Aptr && S.Cptr && scr && dl[0] && dl[1] && J->fault_tid != tid;
    if (!ok) atomic_store(&J->fail, 1);
    J->div_list[0][tid] = dl[0];
    J->div_list[1][tid] = dl[1];
    J->div_n[0][tid] = J->div_n[1][tid] = 0;
    J->total_steps[tid] = 0;
    /* split by columns: every thread's lists exist, and every thread stops if one has no memory
     * (split by rows the barrier is one thread's: each runs its rows if its own memory is there) */
    if (!barrier_wait_any(&J->bar, &sense, !ok)) {
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
                    ap[i] = state_buf(J->H, J->Hb, S.tt[s - S.r0]) + (size_t)s * dp;
                }
                double bl[64];
                if (J->bits) {
                    K->gemm_rows(nb, ap, J->RoT, kd, 0, Vp, sp);
                    for (int i = 0; i < nb; i++) {
                        const int s = S.rows[b0 + i];
                        const int64_t pos = J->start[s] + S.tt[s - S.r0];
                        bl[i] = K->lse_bits(sp[i], V, Vp, J->ids[pos]);
                        J->bits[pos] = bl[i];
                    }
                }
                for (int i = 0; i < nb; i++) {
                    if (!K->row_ok(ap[i], dp, J->limit) || (J->bits && !isfinite(bl[i]))) {
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
            if (writes) J->total_steps[tid] += n;
            barrier_wait(&J->bar, &sense); /* no flag: the next schedule decides (see sched_round) */
        }
    }
    barrier_wait(&J->bar, &sense); /* nobody frees a divergence list another may still read */
    free(S.tt); free(S.stopped); symq_free(&S.q); free(S.prev); free(S.rows);
    free(S.grp_sym); free(S.grp_start); free(S.Aptr); free(S.Cptr); free(scr);
    free(dl[0]); free(dl[1]);
}

/* ------------------------------------------------------------------------------------------
 * seq_composed: one stream through the table. Returns the index of the first jump whose
 * resulting state is out of range (or whose bits are not finite), or -1.
 * ------------------------------------------------------------------------------------------ */
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

static void seq_set_nt(void *arg, int nt) {
    SeqJob *J = (SeqJob *)arg;
    J->nt = nt;
    barrier_init(&J->bar, nt);
}

/* One stream through the table; with nt threads, each computes a slice of every matrix-vector
 * product's rows (so each reads a slice of every matrix: the stream is memory-bound, and two
 * cores draw on the caches and memory at once) and the readouts of a share of each match's
 * characters; one barrier a match. */
static void seq_work(void *arg, int tid, int nt) {
    SeqJob *J = (SeqJob *)arg;
    const Kernels *K = J->K;
    const int d = J->d, V = J->V, kd = J->kd;
    const int Vp = (V + 15) & ~15;
    int sense = 0;
    size_t nbuf = sizeof(float) * (size_t)(J->max_len * V + Vp + 16);
    nbuf = (nbuf + 63) & ~(size_t)63;
    float *logits = J->fault_tid == tid ? NULL : (float *)aligned_alloc(64, nbuf);
    if (!logits) atomic_store(&J->fail, 1);
    if (barrier_wait_any(&J->bar, &sense, !logits)) { free(logits); return; } /* all stop if one has no memory */
    float *l1 = logits + (size_t)J->max_len * V;
    /* this thread's rows of [A | c]: multiples of 4 */
    const int r0 = 4 * ((d / 4) * tid / nt), r1 = tid == nt - 1 ? d : 4 * ((d / 4) * (tid + 1) / nt);
    int64_t pos = 0;
    for (int64_t j = 0; j < J->n_matches; j++) {
        int bad = 0; /* this thread found bits that are not finite or a state out of range */
        const float *h = J->hb[j & 1];
        float *hn = J->hb[(j + 1) & 1];
        const int64_t e = J->entries[j];
        const int k = (int)J->lengths[e];
        if (J->bits) {
            const int i0 = k * tid / nt, i1 = k * (tid + 1) / nt; /* this thread's characters */
            if (i1 > i0) {
                const size_t roff = ((size_t)J->offsets[e] + i0) * V * kd;
                if (J->f16) K->matvec_f16((const uint16_t *)J->R + roff, (i1 - i0) * V, kd, h, logits);
                else K->matvec_f32((const float *)J->R + roff, (i1 - i0) * V, kd, h, logits);
                for (int i = i0; i < i1; i++) {
                    memcpy(l1, logits + (size_t)(i - i0) * V, sizeof(float) * V);
                    const double b = K->lse_bits(l1, V, Vp, J->ids[pos + i]);
                    J->bits[pos + i] = b;
                    if (!isfinite(b)) bad = 1;
                }
            }
        }
        const size_t aoff = ((size_t)e * d + r0) * kd;
        if (r1 > r0) {
            if (J->f16) K->matvec_f16((const uint16_t *)J->Ac + aoff, r1 - r0, kd, h, hn + r0);
            else K->matvec_f32((const float *)J->Ac + aoff, r1 - r0, kd, h, hn + r0);
            for (int i = r0; i < r1; i++)
                if (!(fabsf(hn[i]) <= J->limit)) {
                    bad = 1;
                    break;
                }
        }
        pos += k;
        /* The barrier tells every thread whether any found a bad match: all stop at the same match
         * (a flag read after the barrier could already carry the next match's news from a faster
         * thread, and then the threads would stop at different matches: the hang of issue 20). */
        if (barrier_wait_any(&J->bar, &sense, bad)) {
            if (tid == 0) {
                atomic_store(&J->bad, j);
                memcpy(J->h, hn, sizeof(float) * kd);
            }
            break;
        }
        if (tid == 0 && j == J->n_matches - 1) memcpy(J->h, hn, sizeof(float) * kd);
    }
    free(logits);
}

/* ------------------------------------------------------------------------------------------
 * run_jumps: run_streams with composed jumps (issue 22). Each round every active row takes one
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
 * ------------------------------------------------------------------------------------------ */
typedef struct {
    const Kernels *K;
    const float *M, *RoT;
    int f16; /* M holds IEEE halves (uint16) */
    const int64_t *m_off;
    const int32_t *klen, *children, *entry_of;
    int n_ent, n_nodes, max_k;
    int nsym, V, Vp, d, dp, kd;
    int P, pairs;
    const int32_t *ids;
    const int64_t *start, *len;
    float *H, *Hb;
    double *bits;
    float stop_ratio;
    int check_every;
    float limit;
    int64_t *steps_done;
    float *residual;
    int64_t *diverged;
    float frac;    /* a round takes the entry queues at least this share of the longest */
    int nt;
    Barrier bar;
    int64_t total_steps[64];
    int64_t jumps[64];
    atomic_int fail;
    int fault_tid;
} JumpsJob;

static void jumps_set_nt(void *arg, int nt) {
    JumpsJob *J = (JumpsJob *)arg;
    J->nt = nt;
    barrier_init(&J->bar, 1);
}

/* the entry of the longest table key that ids[p : p + avail] starts with (avail >= 1; every single
 * symbol is a key): the greedy longest match, not past the row's end */
static inline int jumps_longest(const JumpsJob *J, const int32_t *x, int64_t avail) {
    int32_t node = 0;
    int best = -1;
    const int64_t lim = avail < J->max_k ? avail : J->max_k;
    for (int64_t j = 0; j < lim; j++) {
        node = J->children[(size_t)node * J->nsym + x[j]];
        if (node < 0) break;
        if (J->entry_of[node] >= 0) best = J->entry_of[node];
    }
    return best;
}

static void jumps_work(void *arg, int tid, int nt) {
    JumpsJob *J = (JumpsJob *)arg;
    const Kernels *K = J->K;
    int sense = 0;
    const int dp = J->dp, kd = J->kd, Vp = J->Vp, V = J->V, P = J->P, E = J->n_ent;
    const int r0 = (int)((int64_t)P * tid / nt), r1 = (int)((int64_t)P * (tid + 1) / nt), nr = r1 - r0;
    const int VLk = K->vl, jmax = (J->d + VLk - 1) / VLk * VLk;
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
             J->fault_tid != tid;
    if (!ok) atomic_store(&J->fail, 1);
    J->total_steps[tid] = 0;
    J->jumps[tid] = 0;
    if (!barrier_wait_any(&J->bar, &sense, !ok)) {
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
                if (dead[ls] || pos[ls] >= J->len[s]) stop = 1;
                else if (J->pairs && nj[ls] > 0 && nj[ls] % J->check_every == 0) {
                    const float r = pair_residual(K, state_buf(J->H, J->Hb, nj[ls]), s, P, dp);
                    J->residual[s] = r;
                    if (r <= J->stop_ratio) stop = 1;
                }
                if (stop) {
                    live--;
                    J->steps_done[s] = pos[ls] < J->len[s] ? pos[ls] : J->len[s];
                    if (nj[ls] & 1) final_to_H(J->H, J->Hb, s, P, J->pairs, dp);
                    continue;
                }
                ent[ls] = jumps_longest(J, J->ids + J->start[s] + pos[ls], J->len[s] - pos[ls]);
                symq_push(&Q, ls, ent[ls]);
            }
            if (live == 0) break;
            /* this round's queues: whole groups of one entry each */
            const int thr = symq_threshold(&Q, J->frac);
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
                const int64_t p = J->start[s] + pos[ls], k = J->klen[ent[ls]], end = J->start[s] + J->len[s];
                const int64_t walk_end = p + k + J->max_k - 1 < end ? p + k + J->max_k - 1 : end - 1;
                __builtin_prefetch(J->ids + p);
                __builtin_prefetch(J->ids + walk_end);
                if (J->bits) {
                    __builtin_prefetch(J->bits + p, 1);
                    __builtin_prefetch(J->bits + p + k - 1, 1);
                }
            }
            /* each row's state (and its error row's) and where the jump writes them */
            for (int q = 0; q < n; q++) {
                const int s = active[q];
                const float *cur = state_buf(J->H, J->Hb, nj[s - r0]);
                float *nxt = state_buf(J->H, J->Hb, nj[s - r0] + 1);
                Ap[q] = cur + (size_t)s * dp;
                Cp[q] = nxt + (size_t)s * dp;
                if (J->pairs) {
                    EAp[q] = cur + (size_t)(s + P) * dp;
                    ECp[q] = nxt + (size_t)(s + P) * dp;
                }
            }
            /* the readout before each jump, with the range check */
            for (int b0 = 0; b0 < n; b0 += 64) {
                const int nb = n - b0 < 64 ? n - b0 : 64;
                if (J->bits) {
                    for (int i = 0; i < nb; i++) sp[i] = scr + (size_t)i * Vp;
                    K->gemm_rows(nb, Ap + b0, J->RoT, kd, 0, Vp, sp);
                }
                for (int i = 0; i < nb; i++) {
                    const int s = active[b0 + i], ls = s - r0;
                    const int64_t p = J->start[s] + pos[ls];
                    double b = 0.0;
                    if (J->bits) {
                        b = K->lse_bits(sp[i], V, Vp, J->ids[p]);
                        J->bits[p] = b;
                    }
                    if ((!K->row_ok(Ap[b0 + i], dp, J->limit) || !isfinite(b)) && !dead[ls]) {
                        dead[ls] = 1;
                        J->diverged[s] = pos[ls];
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
                if (J->pairs) JGEMM(g1 - g0, EAp + g0, 0, jmax, ECp + g0, NULL, 0);
                if (J->bits && k > 1) { /* the readouts inside the jump, from the same matrix */
                    for (int b0 = g0; b0 < g1; b0 += 64) {
                        const int nb = g1 - b0 < 64 ? g1 - b0 : 64;
                        for (int i = 0; i < nb; i++) sp[i] = scr + (size_t)i * width;
                        JGEMM(nb, Ap + b0, dp, dp + (k - 1) * Vp, sp, NULL, 0);
                        for (int i = 0; i < nb; i++) {
                            const int s = active[b0 + i], ls = s - r0;
                            const int64_t p = J->start[s] + pos[ls];
                            for (int c = 1; c < k; c++) {
                                const double b = K->lse_bits(sp[i] + dp + (size_t)(c - 1) * Vp, V, Vp, J->ids[p + c]);
                                J->bits[p + c] = b;
                                if (!isfinite(b) && !dead[ls]) {
                                    dead[ls] = 1;
                                    J->diverged[s] = pos[ls] + c;
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
        J->total_steps[tid] = steps;
    }
    free(active); free(ent); free(pos); free(nj); symq_free(&Q);
    free(dead); free(gent); free(gstart);
    free(Ap); free(Cp); free(EAp); free(ECp); free(scr);
}

/* ------------------------------------------------------------------------------------------
 * Python bindings. The wrappers in streams.py / sequential.py check dtypes, shapes and
 * contiguity; here every buffer's size is checked again against what is read or written.
 * ------------------------------------------------------------------------------------------ */
static int need(Py_buffer *b, Py_ssize_t bytes, const char *name) {
    if (b->len < bytes) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes; the kernel needs %zd", name, b->len, bytes);
        return 0;
    }
    return 1;
}

/* The per-row outputs before a run (nothing done, no residual checked, nothing diverged), and the
 * threads to start: 1..64, no more than the rows when rows are split between threads. */
static int init_rows(int64_t *steps_done, float *residual, int64_t *diverged, int P, int nt, int split_rows) {
    for (int s = 0; s < P; s++) {
        diverged[s] = -1;
        residual[s] = INFINITY;
        steps_done[s] = 0;
    }
    if (nt < 1) nt = 1;
    if (nt > 64) nt = 64;
    if (split_rows && nt > P) nt = P > 0 ? P : 1;
    return nt;
}

/* After a run: a row whose final state is out of range (or not finite) diverged at its last step. */
static void check_final_rows(const float *H, const int64_t *steps_done, int64_t *diverged, int P, int dp,
                             float limit) {
    for (int s = 0; s < P; s++)
        if (diverged[s] < 0 && !KERN->row_ok(H + (size_t)s * dp, dp, limit))
            diverged[s] = steps_done[s];
}

/* Every position a row reads lies inside ids (and bits, with bits) and holds a symbol id below nsym;
 * else a ValueError naming the kernel. */
static int check_rows(const char *kernel, Py_buffer *start, Py_buffer *len, int P, Py_buffer *ids, Py_buffer *bits,
                      int want_bits, int nsym) {
    const int64_t *st = (const int64_t *)start->buf, *ln = (const int64_t *)len->buf;
    const Py_ssize_t n_ids = ids->len / 4;
    const int32_t *xi = (const int32_t *)ids->buf;
    for (int s = 0; s < P; s++) {
        if (st[s] < 0 || ln[s] < 0 || st[s] + ln[s] > n_ids) {
            PyErr_Format(PyExc_ValueError, "%s: a row reads outside ids", kernel);
            return 0;
        }
        if (want_bits && (st[s] + ln[s]) * 8 > bits->len) {
            PyErr_Format(PyExc_ValueError, "%s: bits is too short", kernel);
            return 0;
        }
        for (int64_t t = 0; t < ln[s]; t++)
            if (xi[st[s] + t] < 0 || xi[st[s] + t] >= nsym) {
                PyErr_Format(PyExc_ValueError, "%s: a symbol id is out of range", kernel);
                return 0;
            }
    }
    return 1;
}

static PyObject *py_run_streams(PyObject *self, PyObject *args) {
    Py_buffer WT, RoT, ids, start, len, H, Hb, bits, steps_done, residual, diverged;
    int nsym, V, Vp, d, dp, P, pairs, check_every, nt, want_bits, split_cols;
    float stop_ratio, limit, frac;
    if (!PyArg_ParseTuple(args, "y*y*iiiiiy*y*y*w*w*w*iiffiw*w*w*iiif", &WT, &RoT, &nsym, &V, &Vp, &d, &dp, &ids,
                          &start, &len, &H, &Hb, &bits, &P, &pairs, &stop_ratio, &limit, &check_every,
                          &steps_done, &residual, &diverged, &nt, &want_bits, &split_cols, &frac))
        return NULL;
    PyObject *ret = NULL;
    const int rows = pairs ? 2 * P : P;
    int ok = need(&WT, (Py_ssize_t)nsym * dp * (d + 1) * 4, "WT") && need(&RoT, (Py_ssize_t)(d + 1) * Vp * 4, "RoT") &&
             need(&start, (Py_ssize_t)P * 8, "start") && need(&len, (Py_ssize_t)P * 8, "len") &&
             need(&H, (Py_ssize_t)rows * dp * 4, "H") && need(&Hb, (Py_ssize_t)rows * dp * 4, "Hb") &&
             need(&steps_done, (Py_ssize_t)P * 8, "steps_done") && need(&residual, (Py_ssize_t)P * 4, "residual") &&
             need(&diverged, (Py_ssize_t)P * 8, "diverged");
    if (ok && (dp % 16 || dp < d + 1 || Vp % 16 || Vp < V || check_every < 1 || nsym < 1 || nsym > 65536 ||
               !(frac >= 0.0f && frac <= 1.0f))) {
        PyErr_SetString(PyExc_ValueError, "run_streams: inconsistent sizes");
        ok = 0;
    }
    if (ok) ok = check_rows("run_streams", &start, &len, P, &ids, &bits, want_bits, nsym);
    if (ok) {
        StreamsJob *J = (StreamsJob *)calloc(1, sizeof(StreamsJob));
        if (!J) {
            PyErr_NoMemory();
        } else {
            J->K = KERN;
            J->WT = (const float *)WT.buf; J->RoT = (const float *)RoT.buf;
            J->nsym = nsym; J->V = V; J->Vp = Vp; J->d = d; J->dp = dp; J->kd = d + 1;
            J->P = P; J->pairs = pairs; J->split_cols = split_cols; J->frac = frac; J->ids = (const int32_t *)ids.buf;
            J->start = (const int64_t *)start.buf; J->len = (const int64_t *)len.buf;
            J->H = (float *)H.buf; J->Hb = (float *)Hb.buf;
            J->bits = want_bits ? (double *)bits.buf : NULL;
            J->stop_ratio = stop_ratio; J->check_every = check_every; J->limit = limit;
            J->steps_done = (int64_t *)steps_done.buf; J->residual = (float *)residual.buf;
            J->diverged = (int64_t *)diverged.buf;
            J->fault_tid = atomic_exchange(&fault_alloc_tid, -1);
            const int max_threads = atomic_exchange(&fault_max_threads, 0);
            nt = init_rows(J->steps_done, J->residual, J->diverged, P, nt, !split_cols);
            long long total = 0;
            Py_BEGIN_ALLOW_THREADS
            const int used = run_parallel(streams_work, J, nt, streams_set_nt, max_threads);
            barrier_destroy(&J->bar);
            for (int q = 0; q < used; q++) total += J->total_steps[q];
            if (!atomic_load(&J->fail)) check_final_rows(J->H, J->steps_done, J->diverged, P, dp, limit);
            Py_END_ALLOW_THREADS
            if (atomic_load(&J->fail)) PyErr_NoMemory();
            else ret = Py_BuildValue("L", total);
            free(J);
        }
    }
    PyBuffer_Release(&WT); PyBuffer_Release(&RoT); PyBuffer_Release(&ids); PyBuffer_Release(&start);
    PyBuffer_Release(&len); PyBuffer_Release(&H); PyBuffer_Release(&Hb); PyBuffer_Release(&bits);
    PyBuffer_Release(&steps_done); PyBuffer_Release(&residual); PyBuffer_Release(&diverged);
    return ret;
}

static PyObject *py_run_jumps(PyObject *self, PyObject *args) {
    Py_buffer M, m_off, klen, children, entry_of, RoT, ids, start, len, H, Hb, bits, steps_done, residual, diverged;
    int nsym, V, Vp, d, dp, P, pairs, check_every, nt, want_bits, f16;
    float stop_ratio, limit, frac;
    if (!PyArg_ParseTuple(args, "y*iy*y*y*y*y*iiiiiy*y*y*w*w*w*iiffiw*w*w*iif", &M, &f16, &m_off, &klen, &children,
                          &entry_of, &RoT, &nsym, &V, &Vp, &d, &dp, &ids, &start, &len, &H, &Hb, &bits, &P, &pairs,
                          &stop_ratio, &limit, &check_every, &steps_done, &residual, &diverged, &nt, &want_bits,
                          &frac))
        return NULL;
    PyObject *ret = NULL;
    const int rows = pairs ? 2 * P : P, kd = d + 1;
    const Py_ssize_t E = klen.len / 4, n_nodes = entry_of.len / 4;
    int ok = need(&m_off, E * 8, "m_off") && need(&children, n_nodes * nsym * 4, "children") &&
             need(&RoT, (Py_ssize_t)kd * Vp * 4, "RoT") && need(&start, (Py_ssize_t)P * 8, "start") &&
             need(&len, (Py_ssize_t)P * 8, "len") && need(&H, (Py_ssize_t)rows * dp * 4, "H") &&
             need(&Hb, (Py_ssize_t)rows * dp * 4, "Hb") && need(&steps_done, (Py_ssize_t)P * 8, "steps_done") &&
             need(&residual, (Py_ssize_t)P * 4, "residual") && need(&diverged, (Py_ssize_t)P * 8, "diverged");
    if (ok && (dp % 16 || dp < kd || Vp % 16 || Vp < V || check_every < 1 || nsym < 1 || nsym > 65536 || E < 1 ||
               n_nodes < 1 || !(frac >= 0.0f && frac <= 1.0f))) {
        PyErr_SetString(PyExc_ValueError, "run_jumps: inconsistent sizes");
        ok = 0;
    }
    int max_k = 1;
    if (ok) { /* every entry's matrix inside M; the trie's links inside it; every single symbol an entry */
        const int64_t *mo = (const int64_t *)m_off.buf;
        const int32_t *kl = (const int32_t *)klen.buf, *ch = (const int32_t *)children.buf,
                      *en = (const int32_t *)entry_of.buf;
        for (Py_ssize_t e = 0; e < E && ok; e++) {
            if (kl[e] < 1 || kl[e] > 4096 || mo[e] < 0 || mo[e] % 16 ||
                (mo[e] + (int64_t)kd * (dp + (int64_t)(kl[e] - 1) * Vp)) * (f16 ? 2 : 4) > M.len) ok = 0;
            if (ok && kl[e] > max_k) max_k = kl[e];
        }
        for (Py_ssize_t i = 0; i < n_nodes * nsym && ok; i++)
            if (ch[i] < -1 || ch[i] >= n_nodes) ok = 0;
        for (Py_ssize_t i = 0; i < n_nodes && ok; i++)
            if (en[i] < -1 || en[i] >= E) ok = 0;
        for (int x = 0; x < nsym && ok; x++)
            if (ch[x] < 0 || en[ch[x]] < 0) ok = 0;
        if (!ok) PyErr_SetString(PyExc_ValueError, "run_jumps: an entry outside M, a trie link out of range, or a "
                                                   "single symbol that is not an entry");
    }
    if (ok) ok = check_rows("run_jumps", &start, &len, P, &ids, &bits, want_bits, nsym);
    if (ok) {
        JumpsJob *J = (JumpsJob *)calloc(1, sizeof(JumpsJob));
        if (!J) {
            PyErr_NoMemory();
        } else {
            J->K = KERN;
            J->M = (const float *)M.buf; J->f16 = f16 != 0; J->RoT = (const float *)RoT.buf;
            J->m_off = (const int64_t *)m_off.buf;
            J->klen = (const int32_t *)klen.buf; J->children = (const int32_t *)children.buf;
            J->entry_of = (const int32_t *)entry_of.buf; J->n_ent = (int)E; J->n_nodes = (int)n_nodes; J->max_k = max_k;
            J->nsym = nsym; J->V = V; J->Vp = Vp; J->d = d; J->dp = dp; J->kd = kd;
            J->P = P; J->pairs = pairs; J->ids = (const int32_t *)ids.buf;
            J->start = (const int64_t *)start.buf; J->len = (const int64_t *)len.buf;
            J->H = (float *)H.buf; J->Hb = (float *)Hb.buf;
            J->bits = want_bits ? (double *)bits.buf : NULL;
            J->stop_ratio = stop_ratio; J->check_every = check_every; J->limit = limit;
            J->steps_done = (int64_t *)steps_done.buf; J->residual = (float *)residual.buf;
            J->diverged = (int64_t *)diverged.buf;
            J->frac = frac;
            J->fault_tid = atomic_exchange(&fault_alloc_tid, -1);
            const int max_threads = atomic_exchange(&fault_max_threads, 0);
            nt = init_rows(J->steps_done, J->residual, J->diverged, P, nt, 1);
            long long total = 0, jumps = 0;
            Py_BEGIN_ALLOW_THREADS
            const int used = run_parallel(jumps_work, J, nt, jumps_set_nt, max_threads);
            barrier_destroy(&J->bar);
            for (int q = 0; q < used; q++) { total += J->total_steps[q]; jumps += J->jumps[q]; }
            if (!atomic_load(&J->fail)) check_final_rows(J->H, J->steps_done, J->diverged, P, dp, limit);
            Py_END_ALLOW_THREADS
            if (atomic_load(&J->fail)) PyErr_NoMemory();
            else ret = Py_BuildValue("LL", total, jumps);
            free(J);
        }
    }
    PyBuffer_Release(&M); PyBuffer_Release(&m_off); PyBuffer_Release(&klen); PyBuffer_Release(&children);
    PyBuffer_Release(&entry_of); PyBuffer_Release(&RoT); PyBuffer_Release(&ids); PyBuffer_Release(&start);
    PyBuffer_Release(&len); PyBuffer_Release(&H); PyBuffer_Release(&Hb); PyBuffer_Release(&bits);
    PyBuffer_Release(&steps_done); PyBuffer_Release(&residual); PyBuffer_Release(&diverged);
    return ret;
}

static PyObject *py_seq_composed(PyObject *self, PyObject *args) {
    Py_buffer Ac, R, offsets, lengths, entries, ids, h, bits;
    int f16, d, V, max_len, want_bits, nt;
    float limit;
    if (!PyArg_ParseTuple(args, "y*y*iy*y*y*y*iiiw*w*ifi", &Ac, &R, &f16, &offsets, &lengths, &entries, &ids, &d, &V,
                          &max_len, &h, &bits, &want_bits, &limit, &nt))
        return NULL;
    PyObject *ret = NULL;
    const int kd = d + 1, isz = f16 ? 2 : 4;
    const Py_ssize_t n_ent = lengths.len / 8, n_m = entries.len / 8, n_rows = R.len / ((Py_ssize_t)V * kd * isz);
    int ok = need(&offsets, n_ent * 8, "offsets") && need(&h, (Py_ssize_t)(kd + 16) * 4, "h");
    const int64_t *ent = (const int64_t *)entries.buf, *ln = (const int64_t *)lengths.buf, *of = (const int64_t *)offsets.buf;
    int64_t total = 0;
    for (Py_ssize_t j = 0; ok && j < n_m; j++) {
        const int64_t e = ent[j];
        if (e < 0 || e >= n_ent || (e + 1) * (Py_ssize_t)d * kd * isz > Ac.len || ln[e] < 1 || ln[e] > max_len ||
            of[e] < 0 || of[e] + ln[e] > n_rows) {
            PyErr_SetString(PyExc_ValueError, "seq_composed: an entry is out of range of the table");
            ok = 0;
        }
        total += ok ? ln[e] : 0;
    }
    if (ok && (total > ids.len / 4 || (want_bits && total * 8 > bits.len))) {
        PyErr_SetString(PyExc_ValueError, "seq_composed: ids or bits shorter than the matches");
        ok = 0;
    }
    if (ok) {
        SeqJob *J = (SeqJob *)calloc(1, sizeof(SeqJob));
        float *hb = (float *)aligned_alloc(64, sizeof(float) * 2 * (size_t)(kd + 16 + 48));
        if (!J || !hb) {
            PyErr_NoMemory();
        } else {
            *J = (SeqJob){.K = KERN, .Ac = Ac.buf, .R = R.buf, .f16 = f16, .offsets = of, .lengths = ln,
                          .entries = ent, .n_matches = (int64_t)n_m, .ids = (const int32_t *)ids.buf, .d = d, .V = V,
                          .kd = kd, .max_len = max_len, .h = (float *)h.buf,
                          .bits = want_bits ? (double *)bits.buf : NULL, .limit = limit};
            const size_t stride = (size_t)(kd + 16 + 48) & ~(size_t)15;
            J->hb[0] = hb;
            J->hb[1] = hb + stride;
            memset(hb, 0, sizeof(float) * 2 * stride);
            memcpy(J->hb[0], h.buf, sizeof(float) * kd);
            J->hb[0][d] = J->hb[1][d] = 1.0f;
            atomic_init(&J->bad, -1);
            J->fault_tid = atomic_exchange(&fault_alloc_tid, -1);
            const int max_threads = atomic_exchange(&fault_max_threads, 0);
            if (nt < 1) nt = 1;
            if (nt > 8) nt = 8;
            if (n_m == 0) nt = 1;
            Py_BEGIN_ALLOW_THREADS
            if (n_m > 0) {
                run_parallel(seq_work, J, nt, seq_set_nt, max_threads);
                barrier_destroy(&J->bar);
            }
            Py_END_ALLOW_THREADS
            if (atomic_load(&J->fail)) PyErr_NoMemory();
            else ret = Py_BuildValue("L", (long long)atomic_load(&J->bad));
        }
        free(J);
        free(hb);
    }
    PyBuffer_Release(&Ac); PyBuffer_Release(&R); PyBuffer_Release(&offsets); PyBuffer_Release(&lengths);
    PyBuffer_Release(&entries); PyBuffer_Release(&ids); PyBuffer_Release(&h); PyBuffer_Release(&bits);
    return ret;
}

/* Greedy longest-match segmentation by walking a trie of the table's keys: from each match start,
 * follow the text down the trie and keep the deepest node that is a table entry. children is
 * (n_nodes, K) int32 (-1: none), entry_of is (n_nodes,) int32 (-1: not an entry); node 0 is the
 * root and every single symbol is an entry, so every match has at least one character. */
static PyObject *py_trie_segment(PyObject *self, PyObject *args) {
    Py_buffer children, entry_of, ids, starts, entries;
    int K;
    if (!PyArg_ParseTuple(args, "y*y*iy*w*w*", &children, &entry_of, &K, &ids, &starts, &entries)) return NULL;
    const int32_t *ch = (const int32_t *)children.buf, *en = (const int32_t *)entry_of.buf, *x = (const int32_t *)ids.buf;
    int64_t *st = (int64_t *)starts.buf, *ent = (int64_t *)entries.buf;
    const Py_ssize_t n_nodes = entry_of.len / 4, N = ids.len / 4, cap = starts.len / 8;
    Py_ssize_t n = 0, i = 0;
    int ok = K > 0 && children.len / 4 >= n_nodes * K && entries.len / 8 >= cap;
    while (ok && i < N) {
        int32_t node = 0, best_e = -1;
        Py_ssize_t best_len = 0, j = i;
        while (j < N) {
            const int32_t s = x[j];
            if (s < 0 || s >= K) { ok = 0; break; }
            node = ch[(size_t)node * K + s];
            if (node < 0) break;
            if (node >= n_nodes) { ok = 0; break; }
            j++;
            if (en[node] >= 0) { best_e = en[node]; best_len = j - i; }
        }
        if (!ok || best_e < 0 || n >= cap) { ok = 0; break; }
        st[n] = i;
        ent[n] = best_e;
        n++;
        i += best_len;
    }
    PyBuffer_Release(&children); PyBuffer_Release(&entry_of); PyBuffer_Release(&ids);
    PyBuffer_Release(&starts); PyBuffer_Release(&entries);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "trie_segment: a symbol outside the trie, a position no entry covers, or too small outputs");
        return NULL;
    }
    return PyLong_FromSsize_t(n);
}

static PyObject *py_greedy_segment(PyObject *self, PyObject *args) {
    Py_buffer M, starts;
    if (!PyArg_ParseTuple(args, "y*w*", &M, &starts)) return NULL;
    const int64_t *m = (const int64_t *)M.buf;
    int64_t *st = (int64_t *)starts.buf;
    const Py_ssize_t N = M.len / 8, cap = starts.len / 8;
    Py_ssize_t i = 0, n = 0;
    int ok = 1;
    while (i < N) {
        if (n >= cap || m[i] < 1) { ok = 0; break; }
        st[n++] = i;
        i += m[i];
    }
    PyBuffer_Release(&M);
    PyBuffer_Release(&starts);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "greedy_segment: match lengths must be >= 1 and starts large enough");
        return NULL;
    }
    return PyLong_FromSsize_t(n);
}

/* The machine's float32 FMA peak as this instruction set reaches it: every thread runs n rounds of
 * 12 independent vector FMAs (enough chains to cover the FMA latency on two ports). */
typedef struct {
    int64_t n;
    float sink[64];
} PeakJob;

static void peak_set_nt(void *arg, int nt) { (void)arg; (void)nt; }

static void peak_work(void *arg, int tid, int nt) {
    PeakJob *J = (PeakJob *)arg;
    (void)nt;
    J->sink[tid] = KERN->fma_loop(J->n);
}

static PyObject *py_fma_peak(PyObject *self, PyObject *args) {
    long long n;
    int nt;
    if (!PyArg_ParseTuple(args, "Li", &n, &nt)) return NULL;
    if (n < 1 || nt < 1 || nt > 64) {
        PyErr_SetString(PyExc_ValueError, "fma_peak: n >= 1 and 1 <= threads <= 64");
        return NULL;
    }
    PeakJob J = {.n = n};
    struct timespec t0, t1;
    int used;
    Py_BEGIN_ALLOW_THREADS
    clock_gettime(CLOCK_MONOTONIC, &t0);
    used = run_parallel(peak_work, &J, nt, peak_set_nt, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    Py_END_ALLOW_THREADS
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const double flops = (double)used * (double)n * 24.0 * KERN->vl;
    float s = 0.0f;
    for (int i = 0; i < used; i++) s += J.sink[i];
    return Py_BuildValue("(ddif)", flops, secs, used, s);
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(KERN->name); }


static PyObject *py_set_isa(PyObject *self, PyObject *args) {
    const char *want;
    if (!PyArg_ParseTuple(args, "s", &want)) return NULL;
    const Kernels *k = choose_kernels(want);
    if (!k) {
        PyErr_Format(PyExc_ValueError, "instruction set %s is not available on this CPU", want);
        return NULL;
    }
    KERN = k;
    return PyUnicode_FromString(KERN->name);
}

/* Test hook: the next kernel call (run_streams or seq_composed, whichever comes first) runs with
 * thread alloc_tid of its team failing its allocations (-1: none), and with at most max_threads
 * threads as if the system refused the others (0: no limit). The call takes and clears both. */
static PyObject *py_inject_faults(PyObject *self, PyObject *args) {
    int alloc_tid, max_threads;
    if (!PyArg_ParseTuple(args, "ii", &alloc_tid, &max_threads)) return NULL;
    atomic_store(&fault_alloc_tid, alloc_tid < 0 ? -1 : alloc_tid);
    atomic_store(&fault_max_threads, max_threads < 0 ? 0 : max_threads);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"run_streams", py_run_streams, METH_VARARGS, "Grouped multi-row scoring (see streams.py)."},
    {"run_jumps", py_run_jumps, METH_VARARGS, "Grouped multi-row scoring by composed jumps (see jumps.py)."},
    {"seq_composed", py_seq_composed, METH_VARARGS, "One stream through a trie table (see sequential.py)."},
    {"greedy_segment", py_greedy_segment, METH_VARARGS, "Greedy longest-match starts from match lengths."},
    {"trie_segment", py_trie_segment, METH_VARARGS, "Greedy longest-match segmentation along a trie (see composed.py)."},
    {"fma_peak", py_fma_peak, METH_VARARGS, "fma_peak(n, threads) -> (flops, seconds, threads used, sink)."},
    {"isa", py_isa, METH_NOARGS, "The instruction set the kernels run with."},
    {"set_isa", py_set_isa, METH_VARARGS, "Choose the instruction set: generic, avx2 or avx512 (tests)."},
    {"inject_faults", py_inject_faults, METH_VARARGS,
     "inject_faults(alloc_tid, max_threads): the next kernel call's thread alloc_tid fails its allocations (-1: "
     "none) and the call gets at most max_threads threads (0: no limit). For the tests of the failure paths."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "isan's compiled kernels.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    KERN = choose_kernels(NULL);
    return PyModule_Create(&module);
}
