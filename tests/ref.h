/* A float64 reference for the op tests: seeded random tensors held both in their dtype's storage and as the exact
 * values that storage holds, a realize-to-doubles helper, and a comparison with a tolerance by dtype relative to
 * the largest reference magnitude. Everything is static inline so each test uses what it needs. */
#ifndef DEFT_TEST_REF_H
#define DEFT_TEST_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft.h"

/* ---- a seeded generator of our own (splitmix64), independent of the library's ---- */
static inline uint64_t ref_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double ref_unif(uint64_t *s, double lo, double hi) {
    return lo + (hi - lo) * ((double)(ref_next(s) >> 11) * (1.0 / 9007199254740992.0));
}

/* ---- dtype storage ---- */
static inline size_t ref_esize(deft_dtype dt) { return deft_dtype_size(dt); }

static inline int32_t ref_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

static inline void ref_store(void *raw, deft_dtype dt, int64_t i, double v) {
    switch (dt) {
    case DEFT_F32: ((float *)raw)[i] = (float)v; break;
    case DEFT_F64: ((double *)raw)[i] = v; break;
    case DEFT_F16: ((uint16_t *)raw)[i] = deft_f32_to_f16((float)v); break;
    case DEFT_BF16: ((uint16_t *)raw)[i] = deft_f32_to_bf16((float)v); break;
    default: ((int32_t *)raw)[i] = ref_to_i32(v); break;
    }
}

static inline double ref_load(const void *raw, deft_dtype dt, int64_t i) {
    switch (dt) {
    case DEFT_F32: return ((const float *)raw)[i];
    case DEFT_F64: return ((const double *)raw)[i];
    case DEFT_F16: return deft_f16_to_f32(((const uint16_t *)raw)[i]);
    case DEFT_BF16: return deft_bf16_to_f32(((const uint16_t *)raw)[i]);
    default: return ((const int32_t *)raw)[i];
    }
}

/* That p's checkpointing dropped one value and recomputed one node, of `flops` (within 1e-6). */
static inline void ref_check_one_recompute(deft_program *p, double flops) {
    deft_checkpoint_report rep;
    CHECK_OK(deft_program_checkpoint(p, &rep));
    CHECK_MSG(rep.dropped == 1 && rep.recomputed == 1 && fabs(rep.recompute_flops - flops) < 1e-6 * flops,
              "checkpoint: dropped %d recomputed %d flops %g (want 1, 1, %g)", rep.dropped, rep.recomputed,
              rep.recompute_flops, flops);
}

/* The first n values of t in program p, of its dtype, as doubles (caller frees). */
static inline double *ref_read_program(deft_program *p, const deft_tensor *t, int64_t n) {
    const deft_dtype dt = deft_tensor_dtype(t);
    void *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    double *out = calloc((size_t)n + 1, sizeof *out);
    CHECK_OK(deft_program_read(p, t, raw, (size_t)n * deft_dtype_size(dt)));
    for (int64_t k = 0; k < n; k++) out[k] = ref_load(raw, dt, k);
    free(raw);
    return out;
}

/* The value v becomes once stored in dt. */
static inline double ref_round(deft_dtype dt, double v) {
    union { double d; float f; uint16_t h; int32_t i; } raw;   /* suitably typed storage for any dtype */
    ref_store(&raw, dt, 0, v);
    return ref_load(&raw, dt, 0);
}

static inline int ref_is_float(deft_dtype dt) { return dt != DEFT_I32; }

/* ---- tensors held twice: storage for the library, exact values for the reference ---- */
typedef struct ref_tensor {
    deft_dtype dt;
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    int64_t n;
    void *raw;
    double *v;
} ref_tensor;

static inline int64_t ref_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

static inline ref_tensor ref_alloc(deft_dtype dt, int ndim, const int64_t *shape) {
    ref_tensor t;
    memset(&t, 0, sizeof t);
    t.dt = dt;
    t.ndim = ndim;
    if (ndim > 0) memcpy(t.shape, shape, sizeof(int64_t) * (size_t)ndim);
    t.n = ref_numel(ndim, shape);
    t.raw = calloc((size_t)t.n + 1, ref_esize(dt));
    t.v = calloc((size_t)t.n + 1, sizeof(double));
    if (!t.raw || !t.v) {
        fprintf(stderr, "ref: out of memory\n");
        exit(2);
    }
    return t;
}

/* Sets element i to v rounded to the dtype, in both forms. */
static inline void ref_set(ref_tensor *t, int64_t i, double v) {
    ref_store(t->raw, t->dt, i, v);
    t->v[i] = ref_load(t->raw, t->dt, i);
}

/* Uniform values in [lo, hi); integers in [lo, hi] for i32. */
static inline ref_tensor ref_random(uint64_t *rng, deft_dtype dt, int ndim, const int64_t *shape, double lo,
                                    double hi) {
    ref_tensor t = ref_alloc(dt, ndim, shape);
    for (int64_t i = 0; i < t.n; i++) {
        double v = ref_unif(rng, lo, hi);
        if (dt == DEFT_I32) v = floor(ref_unif(rng, lo, hi + 1.0));
        ref_set(&t, i, v);
    }
    return t;
}

static inline void ref_free(ref_tensor *t) {
    free(t->raw);
    free(t->v);
    t->raw = NULL;
    t->v = NULL;
}

static inline deft_tensor *ref_const(deft_graph *g, const ref_tensor *t) {
    return deft_constant(g, t->dt, t->ndim, t->shape, deft_cpu(), t->raw, (size_t)t->n * ref_esize(t->dt));
}

static inline deft_tensor *ref_input(deft_graph *g, const char *name, const ref_tensor *t) {
    return deft_input(g, name, t->dt, t->ndim, t->shape, deft_cpu());
}

/* Realizes t and returns its values as doubles (malloc'd, numel entries), or NULL after a failed check. */
static inline double *ref_realize(deft_tensor *t) {
    CHECK_MSG(t != NULL, "builder failed: %s", deft_errmsg());
    if (!t) return NULL;
    const int64_t n = deft_tensor_numel(t);
    const deft_dtype dt = deft_tensor_dtype(t);
    void *raw = malloc((size_t)n * ref_esize(dt) + 8);
    double *out = malloc((size_t)n * sizeof(double) + 8);
    deft_status s = deft_realize(t, raw, (size_t)n * ref_esize(dt));
    CHECK_MSG(s == DEFT_OK, "realize returned %s: %s", deft_status_name(s), deft_errmsg());
    if (s != DEFT_OK) {
        free(raw);
        free(out);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) out[i] = ref_load(raw, dt, i);
    free(raw);
    return out;
}

/* ---- tolerances and comparison ---- */
static inline double ref_tol(deft_dtype dt) {
    switch (dt) {
    case DEFT_F64: return 1e-12;
    case DEFT_F32: return 1e-5;
    case DEFT_F16: return 2e-3;
    case DEFT_BF16: return 1e-2;
    default: return 0.0;
    }
}

/* One check: |got - want| <= tol * max|want| everywhere (exact for tol 0); equal infinities and NaN against NaN
 * match. Prints the worst element when it fails. */
static inline int ref_close_tol(const char *what, const double *got, const double *want, int64_t n, double tol) {
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > scale) scale = fabs(want[i]);
    const double lim = tol * (scale > 0.0 ? scale : 1.0);
    int64_t bad = 0, worst = -1;
    double worst_err = -1.0;
    for (int64_t i = 0; i < n; i++) {
        double err;
        if (isnan(want[i]) || isnan(got[i])) err = isnan(want[i]) && isnan(got[i]) ? 0.0 : INFINITY;
        else if (isinf(want[i]) || isinf(got[i])) err = want[i] == got[i] ? 0.0 : INFINITY;
        else err = fabs(got[i] - want[i]);
        if (err > lim) bad++;
        if (err > worst_err) worst_err = err, worst = i;
    }
    CHECK_MSG(bad == 0, "%s: %lld of %lld elements off; worst [%lld] got %.17g want %.17g (limit %.3g)", what,
              (long long)bad, (long long)n, (long long)worst, worst >= 0 ? got[worst] : 0.0,
              worst >= 0 ? want[worst] : 0.0, lim);
    return bad == 0;
}

static inline int ref_close(const char *what, deft_dtype dt, const double *got, const double *want, int64_t n) {
    return ref_close_tol(what, got, want, n, ref_tol(dt));
}

/* ---- indexing ---- */
static inline void ref_unravel(int ndim, const int64_t *shape, int64_t flat, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
}

/* Flat offset into a tensor of shape `shape` (ndim dims) of the output index idx (ondim dims), numpy broadcast. */
static inline int64_t ref_bcast_offset(int ndim, const int64_t *shape, int ondim, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < ndim; d++) {
        int od = ondim - ndim + d;
        int64_t i = shape[d] == 1 ? 0 : idx[od];
        off = off * shape[d] + i;
    }
    return off;
}

/* The reference of a broadcasting binary op c = a (op) b: f(x, y, k) at every element of c's shape (malloc'd,
 * deft_tensor_numel(c) doubles); k is passed through to f, to pick the op. */
static inline double *ref_binary_want(const deft_tensor *c, const ref_tensor *a, const ref_tensor *b,
                                      double (*f)(double x, double y, int k), int k) {
    const int nd = deft_tensor_ndim(c);
    int64_t oshape[DEFT_MAX_DIMS], idx[DEFT_MAX_DIMS];
    for (int d = 0; d < nd; d++) oshape[d] = deft_tensor_dim(c, d);
    const int64_t n = deft_tensor_numel(c);
    double *want = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; want && i < n; i++) {
        ref_unravel(nd, oshape, i, idx);
        want[i] = f(a->v[ref_bcast_offset(a->ndim, a->shape, nd, idx)],
                    b->v[ref_bcast_offset(b->ndim, b->shape, nd, idx)], k);
    }
    return want;
}

static inline const char *ref_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

static inline int ref_shape_eq(const deft_tensor *t, int ndim, const int64_t *shape) {
    if (!t || deft_tensor_ndim(t) != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (deft_tensor_dim(t, i) != shape[i]) return 0;
    return 1;
}

/* The shapes of the two operands of a broadcasting binary case. */
typedef struct ref_bshape {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
} ref_bshape;

/* Initialisers for local dtype lists (macros, so a test that uses neither draws no unused-variable warning). */
#define REF_ALL_DTYPES {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16, DEFT_I32}
#define REF_FLOAT_DTYPES {DEFT_F32, DEFT_F64, DEFT_F16, DEFT_BF16}

#endif
