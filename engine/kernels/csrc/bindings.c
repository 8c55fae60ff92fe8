/* isan.engine.kernels._native: the Python module (native.h lists the files of the extension).
 *
 * The wrappers in streams.py / jumps.py / sequential.py check dtypes, shapes and contiguity; here
 * every buffer's size is checked again against what is read or written, a job is filled, run with
 * the GIL released, and every buffer released. The two rows kernels share that path (RowsArgs:
 * rows_check_sizes, check_rows, rows_fill, rows_run, rows_release); each adds only its own
 * arguments (run_streams: WT and the split; run_jumps: the table).
 *
 * run_streams, run_jumps, seq_composed, trie_segment and greedy_segment take keyword arguments
 * only (named as in the Python wrappers that call them); a missing or unknown one is a TypeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include "jobs.h"
#include "trie.h"

/* A call of a binding that takes keyword arguments only (kw, NULL-terminated): a TypeError if any
 * is positional or not one of kw, naming it (a missing one is PyArg_ParseTupleAndKeywords'). */
static int keywords_only(const char *name, PyObject *args, PyObject *kwargs, char **kw) {
    if (args && PyTuple_GET_SIZE(args) > 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only", name);
        return 0;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = 0;
        for (int i = 0; k && kw[i] && !known; i++) known = strcmp(k, kw[i]) == 0;
        if (!known) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", name, key);
            return 0;
        }
    }
    return 1;
}

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
static void check_final_rows(const Kernels *K, const float *H, const int64_t *steps_done, int64_t *diverged, int P,
                             int dp, float limit) {
    for (int s = 0; s < P; s++)
        if (diverged[s] < 0 && !K->row_ok(H + (size_t)s * dp, dp, limit))
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

/* What every rows kernel takes from Python: the keywords ROWS_KEYWORDS in the format ROWS_FORMAT
 * into ROWS_TARGETS(a), after each kernel's own. */
typedef struct {
    Py_buffer RoT, ids, start, len, H, Hb, bits, steps_done, residual, diverged;
    int nsym, V, Vp, d, dp, P, pairs, check_every, nt, want_bits;
    float stop_ratio, limit, frac;
} RowsArgs;

#define ROWS_KEYWORDS                                                                                   \
    "RoT", "nsym", "V", "Vp", "d", "dp", "ids", "start", "length", "H", "Hb", "bits", "P", "pairs",      \
        "stop_ratio", "limit", "check_every", "steps_done", "residual", "diverged", "threads", "want_bits", \
        "frac"
#define ROWS_FORMAT "y*iiiiiy*y*y*w*w*w*ipffiw*w*w*ipf"
#define ROWS_TARGETS(a)                                                                                  \
    &(a).RoT, &(a).nsym, &(a).V, &(a).Vp, &(a).d, &(a).dp, &(a).ids, &(a).start, &(a).len, &(a).H, &(a).Hb, \
        &(a).bits, &(a).P, &(a).pairs, &(a).stop_ratio, &(a).limit, &(a).check_every, &(a).steps_done,     \
        &(a).residual, &(a).diverged, &(a).nt, &(a).want_bits, &(a).frac

/* Every shared buffer large enough and the sizes consistent (and the kernel's own sizes, sizes_ok);
 * else a ValueError naming the kernel. */
static int rows_check_sizes(const char *kernel, RowsArgs *a, int sizes_ok) {
    const int rows = a->pairs ? 2 * a->P : a->P, kd = a->d + 1;
    const Py_ssize_t P = a->P;
    if (!(need(&a->RoT, (Py_ssize_t)kd * a->Vp * 4, "RoT") && need(&a->start, P * 8, "start") &&
          need(&a->len, P * 8, "len") && need(&a->H, (Py_ssize_t)rows * a->dp * 4, "H") &&
          need(&a->Hb, (Py_ssize_t)rows * a->dp * 4, "Hb") && need(&a->steps_done, P * 8, "steps_done") &&
          need(&a->residual, P * 4, "residual") && need(&a->diverged, P * 8, "diverged")))
        return 0;
    if (a->dp % 16 || a->dp < kd || a->Vp % 16 || a->Vp < a->V || a->check_every < 1 || a->nsym < 1 ||
        a->nsym > 65536 || !(a->frac >= 0.0f && a->frac <= 1.0f) || !sizes_ok) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes", kernel);
        return 0;
    }
    return 1;
}

/* The shared part of a job from the arguments (the kernel's own fields are the caller's). */
static void rows_fill(RowsJob *R, const RowsArgs *a) {
    R->K = KERN;
    R->RoT = (const float *)a->RoT.buf;
    R->nsym = a->nsym; R->V = a->V; R->Vp = a->Vp; R->d = a->d; R->dp = a->dp; R->kd = a->d + 1;
    R->P = a->P; R->pairs = a->pairs; R->frac = a->frac;
    R->ids = (const int32_t *)a->ids.buf;
    R->start = (const int64_t *)a->start.buf; R->len = (const int64_t *)a->len.buf;
    R->H = (float *)a->H.buf; R->Hb = (float *)a->Hb.buf;
    R->bits = a->want_bits ? (double *)a->bits.buf : NULL;
    R->stop_ratio = a->stop_ratio; R->check_every = a->check_every; R->limit = a->limit;
    R->steps_done = (int64_t *)a->steps_done.buf; R->residual = (float *)a->residual.buf;
    R->diverged = (int64_t *)a->diverged.buf;
}

/* Run a filled job (R its RowsJob, job the whole of it) on its team, the GIL released: the test
 * hooks taken, the per-row outputs reset, work run and joined, then the rows whose final state is
 * out of range marked. Returns the threads used and the steps of all of them in *total, or -1
 * with MemoryError set when a thread had no memory. */
static int rows_run(RowsJob *R, void *job, WorkFn work, void (*set_nt)(void *, int), int nt, int split_rows,
                    long long *total) {
    R->fault_tid = atomic_exchange(&fault_alloc_tid, -1);
    const int max_threads = atomic_exchange(&fault_max_threads, 0);
    nt = init_rows(R->steps_done, R->residual, R->diverged, R->P, nt, split_rows);
    long long sum = 0;
    int used;
    Py_BEGIN_ALLOW_THREADS
    used = run_parallel(work, job, nt, set_nt, max_threads);
    barrier_destroy(&R->bar);
    for (int q = 0; q < used; q++) sum += R->total_steps[q];
    if (!atomic_load(&R->fail)) check_final_rows(R->K, R->H, R->steps_done, R->diverged, R->P, R->dp, R->limit);
    Py_END_ALLOW_THREADS
    if (atomic_load(&R->fail)) {
        PyErr_NoMemory();
        return -1;
    }
    *total = sum;
    return used;
}

static void rows_release(RowsArgs *a) {
    PyBuffer_Release(&a->RoT); PyBuffer_Release(&a->ids); PyBuffer_Release(&a->start); PyBuffer_Release(&a->len);
    PyBuffer_Release(&a->H); PyBuffer_Release(&a->Hb); PyBuffer_Release(&a->bits);
    PyBuffer_Release(&a->steps_done); PyBuffer_Release(&a->residual); PyBuffer_Release(&a->diverged);
}

static PyObject *py_run_streams(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"WT", "split_cols", ROWS_KEYWORDS, NULL};
    RowsArgs a;
    Py_buffer WT;
    int split_cols;
    if (!keywords_only("run_streams", args, kwargs, kw) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "y*p" ROWS_FORMAT ":run_streams", kw, &WT, &split_cols,
                                     ROWS_TARGETS(a)))
        return NULL;
    PyObject *ret = NULL;
    int ok = need(&WT, (Py_ssize_t)a.nsym * a.dp * (a.d + 1) * 4, "WT") && rows_check_sizes("run_streams", &a, 1) &&
             check_rows("run_streams", &a.start, &a.len, a.P, &a.ids, &a.bits, a.want_bits, a.nsym);
    if (ok) {
        StreamsJob *J = (StreamsJob *)calloc(1, sizeof(StreamsJob));
        if (!J) {
            PyErr_NoMemory();
        } else {
            rows_fill(&J->rows, &a);
            J->WT = (const float *)WT.buf;
            J->rows.split_cols = split_cols;
            long long total;
            if (rows_run(&J->rows, J, streams_work, streams_set_nt, a.nt, !split_cols, &total) >= 0)
                ret = Py_BuildValue("L", total);
            free(J);
        }
    }
    PyBuffer_Release(&WT);
    rows_release(&a);
    return ret;
}

/* The jump table: every entry's matrix inside M (max_k: the longest key), the trie's links inside
 * it, every single symbol an entry; else a ValueError. */
static int jumps_check_table(Py_buffer *M, int f16, Py_buffer *m_off, Py_buffer *klen, Py_buffer *children,
                             Py_buffer *entry_of, int nsym, int kd, int dp, int Vp, int *max_k) {
    const Py_ssize_t E = klen->len / 4, n_nodes = entry_of->len / 4;
    const int64_t *mo = (const int64_t *)m_off->buf;
    const int32_t *kl = (const int32_t *)klen->buf, *ch = (const int32_t *)children->buf,
                  *en = (const int32_t *)entry_of->buf;
    int ok = 1;
    *max_k = 1;
    for (Py_ssize_t e = 0; e < E && ok; e++) {
        if (kl[e] < 1 || kl[e] > 4096 || mo[e] < 0 || mo[e] % 16 ||
            (mo[e] + (int64_t)kd * (dp + (int64_t)(kl[e] - 1) * Vp)) * (f16 ? 2 : 4) > M->len) ok = 0;
        if (ok && kl[e] > *max_k) *max_k = kl[e];
    }
    for (Py_ssize_t i = 0; i < n_nodes * nsym && ok; i++)
        if (ch[i] < -1 || ch[i] >= n_nodes) ok = 0;
    for (Py_ssize_t i = 0; i < n_nodes && ok; i++)
        if (en[i] < -1 || en[i] >= E) ok = 0;
    for (int x = 0; x < nsym && ok; x++)
        if (ch[x] < 0 || en[ch[x]] < 0) ok = 0;
    if (!ok) PyErr_SetString(PyExc_ValueError, "run_jumps: an entry outside M, a trie link out of range, or a "
                                               "single symbol that is not an entry");
    return ok;
}

static PyObject *py_run_jumps(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"M", "f16", "m_off", "klen", "children", "entry_of", ROWS_KEYWORDS, NULL};
    RowsArgs a;
    Py_buffer M, m_off, klen, children, entry_of;
    int f16;
    if (!keywords_only("run_jumps", args, kwargs, kw) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "y*py*y*y*y*" ROWS_FORMAT ":run_jumps", kw, &M, &f16, &m_off,
                                     &klen, &children, &entry_of, ROWS_TARGETS(a)))
        return NULL;
    PyObject *ret = NULL;
    const int kd = a.d + 1;
    const Py_ssize_t E = klen.len / 4, n_nodes = entry_of.len / 4;
    int max_k = 1;
    int ok = need(&m_off, E * 8, "m_off") && need(&children, n_nodes * a.nsym * 4, "children") &&
             rows_check_sizes("run_jumps", &a, E >= 1 && n_nodes >= 1) &&
             jumps_check_table(&M, f16, &m_off, &klen, &children, &entry_of, a.nsym, kd, a.dp, a.Vp, &max_k) &&
             check_rows("run_jumps", &a.start, &a.len, a.P, &a.ids, &a.bits, a.want_bits, a.nsym);
    if (ok) {
        JumpsJob *J = (JumpsJob *)calloc(1, sizeof(JumpsJob));
        if (!J) {
            PyErr_NoMemory();
        } else {
            rows_fill(&J->rows, &a);
            J->M = (const float *)M.buf; J->f16 = f16 != 0; J->m_off = (const int64_t *)m_off.buf;
            J->klen = (const int32_t *)klen.buf; J->children = (const int32_t *)children.buf;
            J->entry_of = (const int32_t *)entry_of.buf; J->n_ent = (int)E; J->n_nodes = (int)n_nodes; J->max_k = max_k;
            long long total, jumps = 0;
            const int used = rows_run(&J->rows, J, jumps_work, jumps_set_nt, a.nt, 1, &total);
            if (used >= 0) {
                for (int q = 0; q < used; q++) jumps += J->rows.jumps[q];
                ret = Py_BuildValue("LL", total, jumps);
            }
            free(J);
        }
    }
    PyBuffer_Release(&M); PyBuffer_Release(&m_off); PyBuffer_Release(&klen); PyBuffer_Release(&children);
    PyBuffer_Release(&entry_of);
    rows_release(&a);
    return ret;
}

static PyObject *py_seq_composed(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"Ac", "R", "f16", "offsets", "lengths", "entries", "ids", "d", "V", "max_len", "h", "bits",
                         "want_bits", "limit", "threads", NULL};
    Py_buffer Ac, R, offsets, lengths, entries, ids, h, bits;
    int f16, d, V, max_len, want_bits, nt;
    float limit;
    if (!keywords_only("seq_composed", args, kwargs, kw) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*py*y*y*y*iiiw*w*pfi:seq_composed", kw, &Ac, &R, &f16,
                                     &offsets, &lengths, &entries, &ids, &d, &V, &max_len, &h, &bits, &want_bits,
                                     &limit, &nt))
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

/* Greedy longest-match segmentation by walking a trie of the table's keys (trie.h): from each match
 * start, follow the text down the trie and keep the deepest node that is a table entry. children
 * is (n_nodes, K) int32 (-1: none), entry_of is (n_nodes,) int32 (-1: not an entry); node 0 is the
 * root and every single symbol is an entry, so every match has at least one character. */
static PyObject *py_trie_segment(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"children", "entry_of", "K", "ids", "starts", "entries", NULL};
    Py_buffer children, entry_of, ids, starts, entries;
    int K;
    if (!keywords_only("trie_segment", args, kwargs, kw) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "y*y*iy*w*w*:trie_segment", kw, &children, &entry_of, &K, &ids,
                                     &starts, &entries))
        return NULL;
    const int32_t *ch = (const int32_t *)children.buf, *en = (const int32_t *)entry_of.buf, *x = (const int32_t *)ids.buf;
    int64_t *st = (int64_t *)starts.buf, *ent = (int64_t *)entries.buf;
    const Py_ssize_t n_nodes = entry_of.len / 4, N = ids.len / 4, cap = starts.len / 8;
    Py_ssize_t n = 0, i = 0;
    int ok = K > 0 && children.len / 4 >= n_nodes * K && entries.len / 8 >= cap;
    while (ok && i < N) {
        int64_t best_len;
        const int32_t best_e = trie_longest(ch, en, K, n_nodes, x + i, N - i, &best_len);
        if (best_e < 0 || n >= cap) { ok = 0; break; }
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

static PyObject *py_greedy_segment(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"M", "starts", NULL};
    Py_buffer M, starts;
    if (!keywords_only("greedy_segment", args, kwargs, kw) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "y*w*:greedy_segment", kw, &M, &starts))
        return NULL;
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

static PyObject *py_pin_plan(PyObject *self, PyObject *noargs) {
    static int cpus[1024];
    int n_cores;
    const int n = pin_plan(cpus, 1024, &n_cores);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) PyList_SET_ITEM(l, i, PyLong_FromLong(cpus[i]));
    return l ? Py_BuildValue("(Ni)", l, n_cores) : NULL;
}

static PyObject *py_variant(PyObject *self, PyObject *noargs) { return PyUnicode_FromString(KERN->variant); }

static PyObject *py_variants(PyObject *self, PyObject *noargs) {
    const Kernels *ks[64];
    const int n = kernel_variants(ks, 64);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(ssii)", ks[i]->variant, ks[i]->name, ks[i]->mr, ks[i]->nvm);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

/* The autotune's probe: a pass is `calls` GEMMs, call c applying matrix c % mats (of `mats` matrices
 * of kd x cols, cols rounded up to 16, B in panels as the kernels read it) to a group of `group` rows
 * (rows of kd floats, cycling through `rows` of them), the next matrix prefetched, as a grouped step
 * does; reps passes, the GIL released. Returns (best seconds of one pass, FLOPs of one pass). */
static PyObject *py_time_gemm(PyObject *self, PyObject *args) {
    const char *want;
    int kd, cols, mats, calls, group, rows, reps;
    if (!PyArg_ParseTuple(args, "siiiiiii", &want, &kd, &cols, &mats, &calls, &group, &rows, &reps)) return NULL;
    const Kernels *K = choose_kernels(want);
    if (!K) {
        PyErr_Format(PyExc_ValueError, "kernel variant %s is not available on this CPU", want);
        return NULL;
    }
    if (kd < 1 || kd > 4096 || cols < 1 || cols > 4096 || mats < 1 || mats > 4096 || group < 1 || group > 4096 ||
        calls < 1 || calls > 65536 || rows < group || rows > 65536 || reps < 1 || reps > 1000) {
        PyErr_SetString(PyExc_ValueError, "time_gemm: sizes out of range");
        return NULL;
    }
    cols = (cols + 15) / 16 * 16;
    const size_t dp = (size_t)(kd + 15) / 16 * 16, msz = (size_t)kd * cols;
    float *B = (float *)aligned_alloc(64, sizeof(float) * msz * mats);
    float *A = (float *)aligned_alloc(64, sizeof(float) * dp * rows);
    float *Cb = (float *)aligned_alloc(64, sizeof(float) * (size_t)cols * group);
    const float **Ap = (const float **)malloc(sizeof(float *) * rows);
    float **Cp = (float **)malloc(sizeof(float *) * group);
    double best = INFINITY;
    if (B && A && Cb && Ap && Cp) {
        Py_BEGIN_ALLOW_THREADS
        for (size_t i = 0; i < msz * mats; i++) B[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < dp * rows; i++) A[i] = (float)((i * 40503u) % 1000) * 1e-3f;
        for (int r = 0; r < rows; r++) Ap[r] = A + (size_t)r * dp;
        for (int r = 0; r < group; r++) Cp[r] = Cb + (size_t)r * cols;
        for (int rep = 0; rep < reps; rep++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int c = 0; c < calls; c++) {
                const int r0 = (int)(((int64_t)c * group) % (rows - group + 1));
                const float *next = B + msz * (size_t)((c + 1) % mats);
                K->gemm_rows_pf(group, Ap + r0, B + msz * (size_t)(c % mats), kd, 0, cols, Cp, next, sizeof(float) * msz);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            if (secs < best) best = secs;
        }
        Py_END_ALLOW_THREADS
    }
    free(B); free(A); free(Cb); free(Ap); free(Cp);
    if (!isfinite(best)) return PyErr_NoMemory();
    return Py_BuildValue("(dd)", best, 2.0 * kd * (double)cols * group * calls);
}


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
    {"run_streams", (PyCFunction)(void (*)(void))py_run_streams, METH_VARARGS | METH_KEYWORDS,
     "run_streams(*, WT, split_cols, RoT, nsym, V, Vp, d, dp, ids, start, length, H, Hb, bits, P, pairs, "
     "stop_ratio, limit, check_every, steps_done, residual, diverged, threads, want_bits, frac) -> total steps: "
     "grouped multi-row scoring (see streams.py)."},
    {"run_jumps", (PyCFunction)(void (*)(void))py_run_jumps, METH_VARARGS | METH_KEYWORDS,
     "run_jumps(*, M, f16, m_off, klen, children, entry_of, and run_streams' keywords but WT and split_cols) -> "
     "(total steps, jumps): grouped multi-row scoring by composed jumps (see jumps.py)."},
    {"seq_composed", (PyCFunction)(void (*)(void))py_seq_composed, METH_VARARGS | METH_KEYWORDS,
     "seq_composed(*, Ac, R, f16, offsets, lengths, entries, ids, d, V, max_len, h, bits, want_bits, limit, "
     "threads) -> the first bad match or -1: one stream through a trie table (see sequential.py)."},
    {"greedy_segment", (PyCFunction)(void (*)(void))py_greedy_segment, METH_VARARGS | METH_KEYWORDS,
     "greedy_segment(*, M, starts) -> n: greedy longest-match starts from match lengths."},
    {"trie_segment", (PyCFunction)(void (*)(void))py_trie_segment, METH_VARARGS | METH_KEYWORDS,
     "trie_segment(*, children, entry_of, K, ids, starts, entries) -> n: greedy longest-match segmentation "
     "along a trie (see composed.py)."},
    {"fma_peak", py_fma_peak, METH_VARARGS, "fma_peak(n, threads) -> (flops, seconds, threads used, sink)."},
    {"isa", py_isa, METH_NOARGS, "The instruction set the kernels run with."},
    {"set_isa", py_set_isa, METH_VARARGS,
     "Choose the instruction set (generic, avx2 or avx512: its default tile) or a variant (avx512_6x4)."},
    {"pin_plan", py_pin_plan, METH_NOARGS,
     "([cpus], physical cores): where a team that covers every core is pinned, thread t on cpus[t] (thread 0, the "
     "caller, is not moved); ([], 0) unless ISAN_PIN_THREADS=1 (opt-in)."},
    {"variant", py_variant, METH_NOARGS, "The variant the kernels run with: instruction set and register tile."},
    {"variants", py_variants, METH_NOARGS, "[(variant, isa, rows, vectors)] this CPU runs, each isa's default first."},
    {"time_gemm", py_time_gemm, METH_VARARGS,
     "time_gemm(variant, kd, cols, mats, calls, group, rows, reps) -> (best seconds, flops): the autotune's probe."},
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