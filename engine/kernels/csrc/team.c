/* The thread team of a kernel call and its barrier: see team.h. */
#define _GNU_SOURCE /* CPU_SET, pthread_setaffinity_np */
#include <stdio.h>
#include <unistd.h>

#include "team.h"


#define BARRIER_SPINS 20000 /* pause instructions before yielding (about 1 ms) */
#define BARRIER_YIELDS 64   /* sched_yield calls before sleeping */

void barrier_init(Barrier *b, int n) {
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
void barrier_destroy(Barrier *b) {
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
int barrier_wait_any(Barrier *b, int *local_sense, int flag) {
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


atomic_int fault_alloc_tid = -1;
atomic_int fault_max_threads = 0;

typedef struct { /* the start of a region: workers wait until the caller knows the team's size */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go, nt;
} Start;

typedef struct {
    WorkFn fn;
    void *arg;
    int tid;
    int cpu; /* the CPU this thread is pinned to, or -1 */
    Start *start;
} ThreadArg;

/* ---- placement on physical cores (Linux: the affinity mask and /sys's topology) ---- */
#define MAX_CPUS 1024
static int core_of[MAX_CPUS]; /* the lowest CPU of each CPU's core (its thread_siblings_list), or -1 */
static int n_conf = 0;
static pthread_once_t topo_once = PTHREAD_ONCE_INIT;

static void topo_init(void) {
    long n = sysconf(_SC_NPROCESSORS_CONF);
    n_conf = n < 1 ? 1 : n > MAX_CPUS ? MAX_CPUS : (int)n;
    for (int c = 0; c < MAX_CPUS; c++) core_of[c] = -1;
    for (int c = 0; c < n_conf; c++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int first;
        if (fscanf(f, "%d", &first) == 1 && first >= 0 && first < MAX_CPUS) core_of[c] = first;
        fclose(f);
    }
}

int pin_plan(int *cpus, int cap, int *n_cores) {
    *n_cores = 0;
#ifdef __linux__
    const char *env = getenv("ISAN_PIN_THREADS"); /* opt-in: on a shared, busy machine a pinned thread
                                                    * cannot leave a loaded core (unmeasured there) */
    if (!env || env[0] != '1') return 0;
    cpu_set_t m;
    CPU_ZERO(&m);
    if (sched_getaffinity(0, sizeof m, &m) != 0) return 0;
    pthread_once(&topo_once, topo_init);
    static _Thread_local char seen[MAX_CPUS], chosen[MAX_CPUS];
    memset(seen, 0, sizeof seen);
    memset(chosen, 0, sizeof chosen);
    int n = 0;
    for (int c = 0; c < n_conf && n < cap; c++) /* one CPU of each allowed core first */
        if (CPU_ISSET(c, &m)) {
            const int core = core_of[c] >= 0 ? core_of[c] : c;
            if (!seen[core]) {
                seen[core] = 1;
                chosen[c] = 1;
                cpus[n++] = c;
            }
        }
    *n_cores = n;
    for (int c = 0; c < n_conf && n < cap; c++) /* then their other hardware threads */
        if (CPU_ISSET(c, &m) && !chosen[c]) cpus[n++] = c;
    return n;
#else
    (void)cpus; (void)cap;
    return 0;
#endif
}

static void *thread_main(void *p) {
    ThreadArg *t = (ThreadArg *)p;
#ifdef __linux__
    if (t->cpu >= 0) { /* best effort: a refusal leaves the thread where the system puts it */
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(t->cpu, &one);
        (void)pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    }
#endif
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
int run_parallel(WorkFn fn, void *arg, int nt, void (*set_nt)(void *, int), int max_threads) {
    if (nt < 1) nt = 1;
    if (nt > 64) nt = 64;
    if (max_threads > 0 && nt > max_threads) nt = max_threads;
    pthread_t th[64];
    ThreadArg ta[64];
    Start st;
    st.go = 0;
    st.nt = 1;
    int created = 1;
    /* a team that covers every core this process may use puts thread t on the t-th of them (the
     * caller, thread 0, stays where it is: the first core is left to it); a smaller team is not
     * pinned, so that several of them (worker processes, server threads) never pile onto the
     * same first cores */
    int cpus[MAX_CPUS], n_cores = 0, n_cpus = nt > 1 ? pin_plan(cpus, MAX_CPUS, &n_cores) : 0;
    const int pin = n_cores > 1 && nt >= n_cores;
    if (nt > 1 && pthread_mutex_init(&st.mu, NULL) == 0) {
        if (pthread_cond_init(&st.cv, NULL) == 0) {
            for (int t = 1; t < nt; t++) {
                ta[t] = (ThreadArg){fn, arg, t, pin ? cpus[t % n_cpus] : -1, &st};
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
