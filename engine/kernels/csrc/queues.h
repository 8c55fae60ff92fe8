/* The per-thread queues of rows of run_streams and run_jumps (rows.h says how a round takes them). */
#ifndef ISAN_QUEUES_H
#define ISAN_QUEUES_H

#include "native.h"

/* The rows of one thread (local indices 0..n-1) in queues: singly linked lists, taken whole. By the
 * symbol each row reads next in run_streams, by the table entry it takes next in run_jumps. */
typedef struct {
    int *head, *next, *cnt; /* (nsym,) first row (-1: empty), (n,) the row after, (nsym,) lengths */
    int nsym;
} SymQueues;

static inline int symq_init(SymQueues *Q, int nsym, int n) {
    Q->nsym = nsym;
    Q->head = (int *)malloc(sizeof(int) * nsym);
    Q->next = (int *)malloc(sizeof(int) * (n + 1));
    Q->cnt = (int *)calloc(nsym, sizeof(int));
    if (!Q->head || !Q->next || !Q->cnt) return 0;
    for (int x = 0; x < nsym; x++) Q->head[x] = -1;
    return 1;
}

static inline void symq_free(SymQueues *Q) { free(Q->head); free(Q->next); free(Q->cnt); }

static inline void symq_push(SymQueues *Q, int ls, int x) {
    Q->next[ls] = Q->head[x];
    Q->head[x] = ls;
    Q->cnt[x]++;
}

/* the longest queue (-1 when all are empty) */
static inline int symq_longest(const SymQueues *Q) {
    int best = -1;
    for (int x = 0; x < Q->nsym; x++)
        if (Q->cnt[x] > 0 && (best < 0 || Q->cnt[x] > Q->cnt[best])) best = x;
    return best;
}

/* the length a queue needs to be taken this round: frac of the longest, at least 1 (frac 0: every
 * non-empty queue) */
static inline int symq_threshold(const SymQueues *Q, float frac) {
    const int x = symq_longest(Q);
    const int thr = x < 0 ? 1 : (int)(frac * (float)Q->cnt[x]);
    return thr < 1 ? 1 : thr;
}

/* empty queue x into out[] as rows ls + r0; returns how many */
static inline int symq_take(SymQueues *Q, int x, int r0, int *out) {
    int n = 0;
    for (int ls = Q->head[x]; ls >= 0; ls = Q->next[ls]) out[n++] = ls + r0;
    Q->head[x] = -1;
    Q->cnt[x] = 0;
    return n;
}

#endif
