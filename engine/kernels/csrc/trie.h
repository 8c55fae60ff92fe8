/* The greedy longest-match walk along a trie of a table's keys: the one walk of trie_segment
 * (bindings.c: a whole text's segmentation) and of run_jumps (jumps.c: the key a row takes next). */
#ifndef ISAN_TRIE_H
#define ISAN_TRIE_H

#include <stdint.h>
#include <stddef.h>

/* The entry of the longest key that x[0:n] starts with, walking children (n_nodes, nsym) int32
 * (-1: no child; node 0 the root) and entry_of (n_nodes,) int32 (-1: no key ends there); its
 * length in characters in *len. Returns -1 (and *len 0) when no key matches, -2 when the walk meets
 * a symbol outside 0..nsym-1 or a link outside the n_nodes nodes. */
static inline int32_t trie_longest(const int32_t *children, const int32_t *entry_of, int nsym, int64_t n_nodes,
                                   const int32_t *x, int64_t n, int64_t *len) {
    int32_t node = 0, best = -1;
    int64_t best_len = 0;
    for (int64_t j = 0; j < n; j++) {
        const int32_t s = x[j];
        if (s < 0 || s >= nsym) return -2;
        node = children[(size_t)node * nsym + s];
        if (node < 0) break;
        if (node >= n_nodes) return -2;
        if (entry_of[node] >= 0) {
            best = entry_of[node];
            best_len = j + 1;
        }
    }
    *len = best_len;
    return best;
}

#endif
