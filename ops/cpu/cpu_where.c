/* where and masked_fill on the CPU: elements chosen, never computed, so every dtype moves as bits of its size. The
 * condition (or mask) holds where it is nonzero in its own dtype: NaN holds, -0 does not, as torch's bool(). The
 * output may be a same-shape input's buffer (the planner's in-place reuse): element i is read before it is written.
 */
#include <string.h>

#include "cpu_internal.h"

static inline int where_holds(const void *c, deft_dtype dt, int64_t i) {
    switch (dt) {
    case DEFT_F32: return ((const float *)c)[i] != 0.0f;
    case DEFT_F64: return ((const double *)c)[i] != 0.0;
    case DEFT_F16:
    case DEFT_BF16: return (((const uint16_t *)c)[i] & 0x7fffu) != 0;   /* all but the sign */
    default: return ((const int32_t *)c)[i] != 0;
    }
}

/* The walk both ops share: out contiguous over n's shape, nops (2 or 3) operands broadcast into it; for each row of
 * the innermost (coalesced) dim, the operands' offsets at its start and their strides along it. */
typedef struct where_walk {
    int nd, nops;
    int64_t shape[DEFT_MAX_DIMS], st[3][DEFT_MAX_DIMS], len, rows;
} where_walk;

static void where_walk_init(where_walk *w, const deft_tensor *n, int nops, const deft_tensor *const *ops) {
    w->nops = nops;
    memcpy(w->shape, n->shape, sizeof(int64_t) * (size_t)n->ndim);
    for (int k = 0; k < nops; k++) deft_broadcast_strides(ops[k]->ndim, ops[k]->shape, n->ndim, n->shape, w->st[k]);
    w->nd = deft_cpu_coalesce(n->ndim, w->shape, nops, w->st);
    if (w->nd == 0) {   /* one element */
        w->nd = 1;
        w->shape[0] = 1;
        for (int k = 0; k < nops; k++) w->st[k][0] = 0;
    }
    w->len = w->shape[w->nd - 1];
    w->rows = deft_shape_numel(n->ndim, n->shape) / (w->len ? w->len : 1);
}

static void where_walk_row(const where_walk *w, int64_t row, int64_t *off) {
    for (int k = 0; k < w->nops; k++) off[k] = 0;
    for (int d = w->nd - 2; d >= 0 && row > 0; d--) {
        const int64_t i = row % w->shape[d];
        row /= w->shape[d];
        for (int k = 0; k < w->nops; k++) off[k] += i * w->st[k][d];
    }
}

/* where: operands (cond, a, b); masked_fill: (a, mask) with `fill` for the held elements. */
#define WHERE_ROWS(E)                                                                                            \
    do {                                                                                                         \
        E *o = out;                                                                                              \
        DEFT_OMP(parallel for schedule(static) if (total > DEFT_CPU_PAR_MIN && w.rows > 1))                      \
        for (int64_t r = 0; r < w.rows; r++) {                                                                   \
            int64_t off[3];                                                                                      \
            where_walk_row(&w, r, off);                                                                          \
            for (int64_t j = 0; j < w.len; j++) {                                                                \
                const int64_t i = r * w.len + j;                                                                 \
                if (fill_mode) {                                                                                 \
                    const E v = ((const E *)x)[off[0] + j * w.st[0][w.nd - 1]];                                  \
                    o[i] = where_holds(c, cdt, off[1] + j * w.st[1][w.nd - 1]) ? fill : v;                       \
                } else {                                                                                         \
                    const int h = where_holds(c, cdt, off[0] + j * w.st[0][w.nd - 1]);                           \
                    o[i] = h ? ((const E *)x)[off[1] + j * w.st[1][w.nd - 1]]                                    \
                             : ((const E *)y)[off[2] + j * w.st[2][w.nd - 1]];                                   \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

/* fill's bits in E: the value stored as the output's dtype. */
#define WHERE_CASE(E)                                                                                            \
    do {                                                                                                         \
        E fill = 0;                                                                                              \
        if (fill_mode) memcpy(&fill, fillv, sizeof fill);                                                        \
        WHERE_ROWS(E);                                                                                           \
    } while (0)

deft_status deft_cpu_where(const deft_tensor *n, void *out, const void *const *in) {
    const bool fill_mode = n->op == DEFT_OP_MASKED_FILL;
    const deft_tensor *tc = fill_mode ? n->src[1] : n->src[0];
    const deft_tensor *ops3[3] = {n->src[0], n->src[1], fill_mode ? NULL : n->src[2]};
    for (int k = fill_mode ? 0 : 1; k < (fill_mode ? 1 : 3); k++)
        if (ops3[k]->dtype != n->dtype) return deft_cpu_dtype_error(n, ops3[k]->dtype);
    if ((unsigned)tc->dtype >= DEFT_DTYPE_COUNT || (unsigned)n->dtype >= DEFT_DTYPE_COUNT)
        return deft_cpu_dtype_error(n, tc->dtype);
    for (int k = 0; k < (fill_mode ? 2 : 3); k++) {
        deft_status s = deft_check_expand_shape(ops3[k], n);
        if (s != DEFT_OK) return deft_set_error(s, "%s: %s", deft_op_name(n->op), deft_errmsg());
    }
    const int64_t total = deft_shape_numel(n->ndim, n->shape);
    if (total == 0) return DEFT_OK;
    where_walk w;
    where_walk_init(&w, n, fill_mode ? 2 : 3, ops3);
    const void *c = fill_mode ? in[1] : in[0], *x = fill_mode ? in[0] : in[1], *y = fill_mode ? NULL : in[2];
    const deft_dtype cdt = tc->dtype;
    unsigned char fillv[8] = {0};
    if (fill_mode) deft_store_from_f64(fillv, n->dtype, 0, n->p.scalar);
    switch (deft_dtype_size(n->dtype)) {
    case 2: WHERE_CASE(uint16_t); break;
    case 4: WHERE_CASE(uint32_t); break;
    default: WHERE_CASE(uint64_t); break;
    }
    return DEFT_OK;
}
