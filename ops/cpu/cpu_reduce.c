/* Sum, mean and max over any set of axes. Float types accumulate in double and i32 in int64; max propagates NaN.
 *
 * The input is regrouped into alternating runs of kept and reduced axes (adjacent axes of one kind merge, size-1
 * axes vanish). When the innermost run is reduced, each output reads contiguous stretches; when it is kept, a
 * chunk of neighbouring outputs is accumulated together so the reads stay contiguous and vectorise. Long reductions
 * are cut into fixed blocks whose partial results are combined in block order: parallel, and deterministic for any
 * thread count. */
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_tuning.h"

#define RED_BLOCK DEFT_CPU_RED_BLOCK   /* reduced elements per block (per output): cpu_tuning.h */
#define RED_CHUNK DEFT_CPU_RED_CHUNK   /* neighbouring outputs per task when the innermost run is kept: cpu_tuning.h */

typedef struct red_plan {
    int nk, nr;                                        /* kept and reduced runs, outermost first */
    int64_t ks[DEFT_MAX_DIMS], kst[DEFT_MAX_DIMS];     /* kept run sizes and input strides */
    int64_t rs[DEFT_MAX_DIMS], rst[DEFT_MAX_DIMS];     /* reduced run sizes and input strides */
    int inner_kept;                                    /* innermost run is kept */
    int64_t nout, rtot;                                /* outputs; inputs per output */
    int64_t inner;                                     /* size of the innermost run (stride 1) */
    int64_t nblk;                                      /* blocks of RED_BLOCK along the reduction */
} red_plan;

static void red_plan_make(red_plan *p, int ndim, const int64_t *shape, uint32_t mask) {
    int64_t str[DEFT_MAX_DIMS];
    deft_shape_strides(ndim, shape, str);
    int64_t gs[DEFT_MAX_DIMS], gst[DEFT_MAX_DIMS];
    int gred[DEFT_MAX_DIMS], ng = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        int red = (mask >> d) & 1u;
        if (ng > 0 && gred[ng - 1] == red) {
            /* The input is contiguous, so adjacent runs of one kind always merge. */
            gs[ng - 1] *= shape[d];
            gst[ng - 1] = str[d];
        } else {
            gs[ng] = shape[d], gst[ng] = str[d], gred[ng] = red;
            ng++;
        }
    }
    p->nk = p->nr = 0;
    p->nout = p->rtot = 1;
    for (int g = 0; g < ng; g++) {
        if (gred[g]) {
            p->rs[p->nr] = gs[g], p->rst[p->nr] = gst[g], p->nr++;
            p->rtot *= gs[g];
        } else {
            p->ks[p->nk] = gs[g], p->kst[p->nk] = gst[g], p->nk++;
            p->nout *= gs[g];
        }
    }
    p->inner_kept = ng > 0 && !gred[ng - 1];
    p->inner = ng > 0 ? gs[ng - 1] : 1;
    p->nblk = (p->rtot + RED_BLOCK - 1) / RED_BLOCK;
}

/* Input offset of kept index o over the first nk kept runs. */
static inline int64_t kept_offset(const red_plan *p, int nk, int64_t o) {
    int64_t off = 0;
    for (int d = nk - 1; d >= 0 && o > 0; d--) {
        off += (o % p->ks[d]) * p->kst[d];
        o /= p->ks[d];
    }
    return off;
}

/* Input offset of reduced index r over the first nr reduced runs. */
static inline int64_t red_offset(const red_plan *p, int nr, int64_t r) {
    int64_t off = 0;
    for (int d = nr - 1; d >= 0 && r > 0; d--) {
        off += (r % p->rs[d]) * p->rst[d];
        r /= p->rs[d];
    }
    return off;
}

#define SUM_STEP(acc, v) ((acc) += (v))
#define MAX_STEP_F(acc, v) ((acc) = ((v) > (acc) || (v) != (v)) ? (v) : (acc))
#define MAX_STEP_I(acc, v) ((acc) = (v) > (acc) ? (v) : (acc))
#define SUM_JOIN(acc, v) SUM_STEP(acc, v)

/* Generates, for one (dtype, op):
 *   name##_inner_red   the partial result of output o over block blk (innermost run reduced)
 *   name##_inner_kept  the partials of nc neighbouring outputs c0.. of outer row orow over block blk (innermost run
 *                      kept), into acc[0..nc)
 * T: storage type, LD: load to ACC, ACC: accumulator, INIT: the identity, STEP(acc, v). */
#define DEFINE_REDUCE(name, T, LD, ACC, INIT, STEP)                                                              \
    static ACC name##_inner_red(const red_plan *p, const T *x, int64_t o, int64_t blk) {                         \
        const T *base = x + kept_offset(p, p->nk, o);                                                            \
        int64_t r = blk * RED_BLOCK, rend = r + RED_BLOCK < p->rtot ? r + RED_BLOCK : p->rtot;                   \
        ACC acc = INIT;                                                                                          \
        while (r < rend) {                                                                                       \
            int64_t run = r / p->inner, pos = r % p->inner;                                                      \
            int64_t cnt = p->inner - pos < rend - r ? p->inner - pos : rend - r;                                 \
            const T *s = base + red_offset(p, p->nr - 1, run) + pos;                                             \
            for (int64_t i = 0; i < cnt; i++) {                                                                  \
                ACC v = LD(s[i]);                                                                                \
                STEP(acc, v);                                                                                    \
            }                                                                                                    \
            r += cnt;                                                                                            \
        }                                                                                                        \
        return acc;                                                                                              \
    }                                                                                                            \
    static void name##_inner_kept(const red_plan *p, const T *x, int64_t orow, int64_t c0, int64_t nc,           \
                                  int64_t blk, ACC *acc) {                                                       \
        const T *base = x + kept_offset(p, p->nk - 1, orow) + c0;                                                \
        int64_t r = blk * RED_BLOCK, rend = r + RED_BLOCK < p->rtot ? r + RED_BLOCK : p->rtot;                   \
        for (int64_t j = 0; j < nc; j++) acc[j] = INIT;                                                          \
        for (; r < rend; r++) {                                                                                  \
            const T *s = base + red_offset(p, p->nr, r);                                                         \
            for (int64_t j = 0; j < nc; j++) {                                                                   \
                ACC v = LD(s[j]);                                                                                \
                STEP(acc[j], v);                                                                                 \
            }                                                                                                    \
        }                                                                                                        \
    }

#define LD_D(v) ((double)(v))
#define LD_I(v) ((int64_t)(v))
#define LD_H(v) ((double)deft_half_unpack(v))
#define LD_B(v) ((double)deft_bf16_unpack(v))

DEFINE_REDUCE(sum_f32, float, LD_D, double, 0.0, SUM_STEP)
DEFINE_REDUCE(sum_f64, double, LD_D, double, 0.0, SUM_STEP)
DEFINE_REDUCE(sum_f16, uint16_t, LD_H, double, 0.0, SUM_STEP)
DEFINE_REDUCE(sum_bf16, uint16_t, LD_B, double, 0.0, SUM_STEP)
DEFINE_REDUCE(sum_i32, int32_t, LD_I, int64_t, 0, SUM_STEP)
DEFINE_REDUCE(max_f32, float, LD_D, double, -INFINITY, MAX_STEP_F)
DEFINE_REDUCE(max_f64, double, LD_D, double, -INFINITY, MAX_STEP_F)
DEFINE_REDUCE(max_f16, uint16_t, LD_H, double, -INFINITY, MAX_STEP_F)
DEFINE_REDUCE(max_bf16, uint16_t, LD_B, double, -INFINITY, MAX_STEP_F)
DEFINE_REDUCE(max_i32, int32_t, LD_I, int64_t, INT64_MIN, MAX_STEP_I)

/* Runs every task of one (dtype, op) and leaves per-block partials in part[o * nblk + blk]. */
#define RUN_REDUCE(name, T, ACC)                                                                                 \
    do {                                                                                                         \
        const T *x = in;                                                                                         \
        ACC *part = partials;                                                                                    \
        if (!p.inner_kept) {                                                                                     \
            const int64_t tasks = p.nout * p.nblk;                                                               \
            DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && tasks > 1))                   \
            for (int64_t t = 0; t < tasks; t++) part[t] = name##_inner_red(&p, x, t / p.nblk, t % p.nblk);       \
        } else {                                                                                                 \
            const int64_t nchunk = (p.inner + RED_CHUNK - 1) / RED_CHUNK;                                        \
            const int64_t tasks = p.nout / p.inner * nchunk * p.nblk;                                            \
            DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && tasks > 1))                   \
            for (int64_t t = 0; t < tasks; t++) {                                                                \
                ACC acc[RED_CHUNK];                                                                              \
                const int64_t blk = t % p.nblk, chunk = t / p.nblk % nchunk, orow = t / p.nblk / nchunk;         \
                const int64_t c0 = chunk * RED_CHUNK;                                                            \
                const int64_t nc = p.inner - c0 < RED_CHUNK ? p.inner - c0 : RED_CHUNK;                          \
                name##_inner_kept(&p, x, orow, c0, nc, blk, acc);                                                \
                for (int64_t j = 0; j < nc; j++) part[(orow * p.inner + c0 + j) * p.nblk + blk] = acc[j];         \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

/* Combines the blocks of each output in block order and stores it rounded to the output dtype. */
#define FINISH_REDUCE(ACC, JOIN, STORE)                                                                          \
    do {                                                                                                         \
        const ACC *part = partials;                                                                              \
        DEFT_OMP(parallel for schedule(static) if (p.nout * p.nblk > DEFT_CPU_PAR_MIN))                          \
        for (int64_t o = 0; o < p.nout; o++) {                                                                   \
            ACC acc = part[o * p.nblk];                                                                          \
            for (int64_t k = 1; k < p.nblk; k++) JOIN(acc, part[o * p.nblk + k]);                                \
            STORE;                                                                                               \
        }                                                                                                        \
    } while (0)

deft_status deft_cpu_reduce(const deft_tensor *n, void *out, const void *in) {
    const deft_tensor *src = n->src[0];
    const deft_dtype dt = n->dtype;
    if ((unsigned)dt >= DEFT_DTYPE_COUNT || src->dtype != dt)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: input is %s, output %s", deft_op_name(n->op),
                              deft_dtype_name(src->dtype), deft_dtype_name(dt));
    if (n->op == DEFT_OP_MEAN && !deft_cpu_is_float(dt)) return deft_cpu_dtype_error(n, dt);
    if (src->ndim < 32 && (n->p.reduce.mask >> src->ndim) != 0)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: reduce mask 0x%x names axes past rank %d", deft_op_name(n->op),
                              (unsigned)n->p.reduce.mask, src->ndim);

    red_plan p;
    red_plan_make(&p, src->ndim, src->shape, n->p.reduce.mask);
    const int64_t total = p.nout * p.rtot;
    (void)total;   /* read only by OpenMP clauses */
    if (p.nout == 0) return DEFT_OK;
    if (p.rtot == 0) {
        /* Nothing to reduce: torch gives 0 for sum, NaN for mean and refuses max; -inf keeps max's identity. */
        double v = n->op == DEFT_OP_SUM ? 0.0 : n->op == DEFT_OP_MEAN ? NAN : -INFINITY;
        for (int64_t o = 0; o < p.nout; o++) deft_store_from_f64(out, dt, o, v);   /* i32: -inf saturates to INT32_MIN */
        return DEFT_OK;
    }

    void *partials = malloc((size_t)(p.nout * p.nblk) * 8);
    if (!partials)
        return deft_set_error(DEFT_ERR_OOM, "%s: no host memory for %lld partial results", deft_op_name(n->op),
                              (long long)(p.nout * p.nblk));
    const int is_max = n->op == DEFT_OP_MAX;
    const double rt = (double)p.rtot;
    const int mean = n->op == DEFT_OP_MEAN;
    switch (dt) {
    case DEFT_F32:
        if (is_max) RUN_REDUCE(max_f32, float, double);
        else RUN_REDUCE(sum_f32, float, double);
        break;
    case DEFT_F64:
        if (is_max) RUN_REDUCE(max_f64, double, double);
        else RUN_REDUCE(sum_f64, double, double);
        break;
    case DEFT_F16:
        if (is_max) RUN_REDUCE(max_f16, uint16_t, double);
        else RUN_REDUCE(sum_f16, uint16_t, double);
        break;
    case DEFT_BF16:
        if (is_max) RUN_REDUCE(max_bf16, uint16_t, double);
        else RUN_REDUCE(sum_bf16, uint16_t, double);
        break;
    default:
        if (is_max) RUN_REDUCE(max_i32, int32_t, int64_t);
        else RUN_REDUCE(sum_i32, int32_t, int64_t);
        break;
    }
    if (dt == DEFT_I32) {
        int32_t *o32 = out;
        if (is_max) FINISH_REDUCE(int64_t, MAX_STEP_I, o32[o] = (int32_t)acc);
        else FINISH_REDUCE(int64_t, SUM_JOIN, o32[o] = deft_cpu_wrap_i32(acc));
    } else if (is_max) {
        FINISH_REDUCE(double, MAX_STEP_F, deft_store_from_f64(out, dt, o, acc));
    } else {
        FINISH_REDUCE(double, SUM_JOIN, deft_store_from_f64(out, dt, o, mean ? acc / rt : acc));
    }
    free(partials);
    return DEFT_OK;
}
