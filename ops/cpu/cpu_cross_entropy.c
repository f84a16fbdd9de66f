/* Fused cross-entropy and its gradient (torch.nn.functional.cross_entropy over [N, C] logits, with an ignore index,
 * label smoothing, and a mean or sum), on f32, f64, f16 and bf16 logits (halves compute in float and round once on
 * the store). The options are the node's p.ce (ir/graph_internal.h). The loss may be f32 beside f16 or bf16 logits,
 * and the gradient's dloss f32 beside them (autocast's loss, deft_cross_entropy_as): halves are read exactly into
 * float, so they give the bits that the logits cast to f32 give, and the gradient's one rounding (double to float
 * to half) is the one the f32 gradient's cast would make. */
#include <string.h>

#include "cpu_internal.h"
#include "cpu_tuning.h"

#define LD_ID(v) (v)
#define ST_ID(v) (v)

/* Rows are summed in a fixed number of chunks (cpu_tuning.h), then the chunks in order: the loss does not depend on
 * the number of threads. */
#define CE_CHUNKS DEFT_CPU_CE_CHUNKS

/* Per dtype: the loss of one row and the gradient of one row. The row maximum m is subtracted before exp (so huge
 * logits stay finite), the exponentials are summed in double, and the loss is formed as (m - x[t]) + log(sum) in
 * double, which keeps its precision when the logits are large. With label smoothing ls the row's loss is
 * (1 - ls) (lse - x[t]) + ls (lse - mean(x)) (torch's: the smoothed target puts ls / C on every class), and its
 * gradient softmax - (1 - ls) onehot - ls / C; without it neither the mean nor the extra terms are formed, so the
 * plain loss is what it always was, bit for bit. The gradient's row o may be the logits' row x (the planner writes
 * the gradient over dying logits, ir/op_table.c): the max and the sum read the whole row first, then element l is
 * read before it is written, and each row belongs to one thread. */
#define DEFINE_CE(sfx, T, C, LD, ST, EXPF)                                                                       \
    static C ce_max_##sfx(const T *x, int64_t len) {                                                             \
        C m = -INFINITY;                                                                                         \
        for (int64_t l = 0; l < len; l++) {                                                                      \
            C v = LD(x[l]);                                                                                      \
            m = (v > m || v != v) ? v : m; /* NaN wins: a row holding NaN gives NaN */                           \
        }                                                                                                        \
        return m;                                                                                                \
    }                                                                                                            \
    static double ce_row_##sfx(const T *x, int64_t len, int32_t t, double ls) {                                  \
        const C m = ce_max_##sfx(x, len);                                                                        \
        double s = 0.0, sx = 0.0;                                                                                \
        for (int64_t l = 0; l < len; l++) s += (double)EXPF(LD(x[l]) - m);                                      \
        const double nll = ((double)m - (double)LD(x[t])) + log(s);                                              \
        if (ls == 0.0) return nll;                                                                               \
        for (int64_t l = 0; l < len; l++) sx += (double)LD(x[l]);                                               \
        const double smooth = ((double)m - sx / (double)len) + log(s);                                           \
        return (1.0 - ls) * nll + ls * smooth;                                                                   \
    }                                                                                                            \
    static void ce_grad_row_##sfx(const T *x, T *o, int64_t len, int32_t t, double scale, double ls) {           \
        const C m = ce_max_##sfx(x, len);                                                                        \
        double s = 0.0;                                                                                          \
        for (int64_t l = 0; l < len; l++) s += (double)EXPF(LD(x[l]) - m);                                      \
        const double inv = 1.0 / s, hit = 1.0 - ls, base = ls / (double)len;                                     \
        for (int64_t l = 0; l < len; l++) {                                                                      \
            const double p = (double)EXPF(LD(x[l]) - m) * inv;                                                   \
            o[l] = ST((C)((p - (l == t ? hit : 0.0) - base) * scale));                                           \
        }                                                                                                        \
    }

DEFINE_CE(f32, float, float, LD_ID, ST_ID, expf)
DEFINE_CE(f64, double, double, LD_ID, ST_ID, exp)
DEFINE_CE(f16, uint16_t, float, deft_half_unpack, deft_half_pack, expf)
DEFINE_CE(bf16, uint16_t, float, deft_bf16_unpack, deft_bf16_pack, expf)

/* Whether row r's target is skipped (the ignore index). */
static inline int ce_ignored(const deft_tensor *n, int32_t target) {
    return n->p.ce.has_ignore && target == n->p.ce.ignore_index;
}

/* Shapes, dtypes, options and every target; `lo` is where the logits sit among the sources (0 for the loss, 1 for
 * its gradient), the targets following them. *count receives the rows not ignored. */
static deft_status ce_check(const deft_tensor *n, int lo, const int32_t *targets, int64_t *count) {
    const char *name = deft_op_name(n->op);
    const deft_tensor *tl = n->src[lo], *tt = n->src[lo + 1];
    if (!deft_cpu_is_float(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    /* the loss: the logits' dtype or f32; the gradient: the logits' */
    const int out_ok = tl->dtype == n->dtype || (lo == 0 && n->dtype == DEFT_F32);
    if (!deft_cpu_is_float(tl->dtype) || !out_ok || tt->dtype != DEFT_I32)
        return deft_set_error(DEFT_ERR_DTYPE, "%s: logits %s and targets %s for a %s output (targets must be i32)",
                              name, deft_dtype_name(tl->dtype), deft_dtype_name(tt->dtype),
                              deft_dtype_name(n->dtype));
    if (tl->ndim != 2 || tt->ndim != 1 || tt->shape[0] != tl->shape[0])
        return deft_set_error(DEFT_ERR_SHAPE, "%s: logits must be [N, C] and targets [N]", name);
    if (!(n->p.ce.smoothing >= 0.0 && n->p.ce.smoothing < 1.0) ||
        (n->p.ce.reduction != DEFT_REDUCTION_MEAN && n->p.ce.reduction != DEFT_REDUCTION_SUM))
        return deft_set_error(DEFT_ERR_INVALID, "%s: label smoothing %g or reduction %d out of range", name,
                              n->p.ce.smoothing, n->p.ce.reduction);
    const int64_t rows = tl->shape[0], c = tl->shape[1];
    int64_t valid = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (ce_ignored(n, targets[r])) continue;
        if (targets[r] < 0 || targets[r] >= c)
            return deft_set_error(DEFT_ERR_INVALID, "cross_entropy: target %d of row %lld is outside [0, %lld)",
                                  (int)targets[r], (long long)r, (long long)c);
        valid++;
    }
    *count = valid;
    return DEFT_OK;
}

#define CE_FORWARD(sfx, T)                                                                                       \
    do {                                                                                                         \
        const T *x = logits;                                                                                     \
        DEFT_OMP(parallel for schedule(static) if (rows * c > DEFT_CPU_PAR_MIN / 4 && nchunks > 1))              \
        for (int64_t k = 0; k < nchunks; k++) {                                                                  \
            const int64_t r1 = (k + 1) * chunk < rows ? (k + 1) * chunk : rows;                                  \
            double acc = 0.0;                                                                                    \
            for (int64_t r = k * chunk; r < r1; r++)                                                             \
                if (!ce_ignored(n, t[r])) acc += ce_row_##sfx(x + r * c, c, t[r], ls);                           \
            part[k] = acc;                                                                                       \
        }                                                                                                        \
    } while (0)

deft_status deft_cpu_cross_entropy(const deft_tensor *n, void *out, const void *logits, const void *targets) {
    const int32_t *t = targets;
    int64_t count = 0;
    deft_status s = ce_check(n, 0, t, &count);
    if (s != DEFT_OK) return s;
    const int64_t rows = n->src[0]->shape[0], c = n->src[0]->shape[1];
    const int64_t chunk = rows > 0 ? (rows + CE_CHUNKS - 1) / CE_CHUNKS : 1;
    const int64_t nchunks = (rows + chunk - 1) / chunk;
    const double ls = n->p.ce.smoothing;
    double part[CE_CHUNKS];
    switch (n->src[0]->dtype) {
    case DEFT_F32: CE_FORWARD(f32, float); break;
    case DEFT_F64: CE_FORWARD(f64, double); break;
    case DEFT_F16: CE_FORWARD(f16, uint16_t); break;
    default: CE_FORWARD(bf16, uint16_t); break;
    }
    double total = 0.0;
    for (int64_t k = 0; k < nchunks; k++) total += part[k];
    /* The mean of no rows (all ignored) is NaN, as in torch. */
    const double loss = n->p.ce.reduction == DEFT_REDUCTION_SUM ? total : count > 0 ? total / (double)count : NAN;
    deft_store_from_f64(out, n->dtype, 0, loss);
    return DEFT_OK;
}

#define CE_BACKWARD(sfx, T)                                                                                      \
    do {                                                                                                         \
        const T *x = logits;                                                                                     \
        T *o = out;                                                                                              \
        DEFT_OMP(parallel for schedule(static) if (rows * c > DEFT_CPU_PAR_MIN / 4 && rows > 1))                 \
        for (int64_t r = 0; r < rows; r++) {                                                                     \
            if (ce_ignored(n, t[r])) memset(o + r * c, 0, (size_t)c * sizeof(T)); /* every dtype's zero */       \
            else ce_grad_row_##sfx(x + r * c, o + r * c, c, t[r], scale, ls);                                    \
        }                                                                                                        \
    } while (0)

static int same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

/* Ignored rows get zeros (torch's: their loss is a constant 0); the others (softmax - target) * dloss / count for
 * the mean, * dloss for the sum. */
deft_status deft_cpu_cross_entropy_grad(const deft_tensor *n, void *out, const void *dloss, const void *logits,
                                        const void *targets) {
    const int32_t *t = targets;
    int64_t count = 0;
    deft_status s = ce_check(n, 1, t, &count);
    if (s != DEFT_OK) return s;
    const deft_tensor *td = n->src[0];
    if ((td->dtype != n->dtype && td->dtype != DEFT_F32) || deft_shape_numel(td->ndim, td->shape) != 1)
        return deft_set_error(DEFT_ERR_SHAPE, "cross_entropy_grad: the loss gradient must be one %s or f32 element",
                              deft_dtype_name(n->dtype));
    if (!same_shape(n, n->src[1]))
        return deft_set_error(DEFT_ERR_SHAPE, "cross_entropy_grad: the output must have the logits' shape");
    const int64_t rows = n->src[1]->shape[0], c = n->src[1]->shape[1];
    if (rows == 0 || c == 0) return DEFT_OK;
    const double dl = deft_load_as_f64(dloss, td->dtype, 0), ls = n->p.ce.smoothing;
    const double scale = n->p.ce.reduction == DEFT_REDUCTION_SUM ? dl : count > 0 ? dl / (double)count : 0.0;
    switch (n->dtype) {
    case DEFT_F32: CE_BACKWARD(f32, float); break;
    case DEFT_F64: CE_BACKWARD(f64, double); break;
    case DEFT_F16: CE_BACKWARD(f16, uint16_t); break;
    default: CE_BACKWARD(bf16, uint16_t); break;
    }
    return DEFT_OK;
}
