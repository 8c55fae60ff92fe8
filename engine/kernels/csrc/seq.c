/* seq_composed: one stream through a trie table (jobs.h, native.h). */
#include "jobs.h"

void seq_set_nt(void *arg, int nt) {
    SeqJob *J = (SeqJob *)arg;
    J->nt = nt;
    barrier_init(&J->bar, nt);
}

/* One stream through the table; with nt threads, each computes a slice of every matrix-vector
 * product's rows (so each reads a slice of every matrix: the stream is memory-bound, and two
 * cores draw on the caches and memory at once) and the readouts of a share of each match's
 * characters; one barrier a match. */
void seq_work(void *arg, int tid, int nt) {
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