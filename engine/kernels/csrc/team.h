/* The thread team of a kernel call and its barrier (team.c); the fault-injection hooks of the tests. */
#ifndef ISAN_TEAM_H
#define ISAN_TEAM_H

#include "native.h"

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

void barrier_init(Barrier *b, int n);
/* After the region has been joined (no thread is inside a barrier any more). */
void barrier_destroy(Barrier *b);
/* Wait until all b->n threads have arrived; returns 1 if any of them passed flag != 0 in this
 * phase, the same answer in every thread (team.c says how). */
int barrier_wait_any(Barrier *b, int *local_sense, int flag);
static inline void barrier_wait(Barrier *b, int *local_sense) { (void)barrier_wait_any(b, local_sense, 0); }

/* Test hooks (inject_faults): armed by Python, taken (and disarmed) by the next kernel call. */
extern atomic_int fault_alloc_tid;   /* that thread of the next call's team fails its allocations */
extern atomic_int fault_max_threads; /* the next call gets at most this many threads (0: no limit) */

typedef void (*WorkFn)(void *arg, int tid, int nt);

/* The CPUs this thread may run on, one of each physical core first (their other hardware threads
 * after), into cpus (at most cap); *n_cores: how many distinct cores. Returns the count; 0 unless
 * ISAN_PIN_THREADS=1 (pinning is opt-in), or when the mask cannot be read. run_parallel pins a team that
 * covers every core along it (team.c). */
int pin_plan(int *cpus, int cap, int *n_cores);

/* Run fn(arg, tid, nt) on up to nt threads (the caller is thread 0) and join them; set_nt(arg, n)
 * is called with the final count before any work starts. Returns the count (team.c). */
int run_parallel(WorkFn fn, void *arg, int nt, void (*set_nt)(void *, int), int max_threads);

#endif
