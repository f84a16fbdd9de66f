/* Checks shared by the builders: one place for each message users see. */
#include <string.h>

#include "checked.h"
#include "device_internal.h"
#include "node.h"

/* Where a message about a NULL operand quotes the error before it: a chain of calls after one failure quotes that
 * failure once, not each link. */
#define DEFT_NULL_CAUSE "; the last error before it: "

/* A NULL operand: usually the result of a call that failed (its message is the one worth reading), else a mistake
 * of its own. Either way the call fails saying which operand, on the graph of another operand when there is one
 * (quoting that graph's first error, the cause, if it has one), else quoting this thread's last error. */
static void deft_null_operand(const char *op, int n, deft_tensor *const *srcs, int i) {
    deft_graph *g = NULL;
    for (int j = 0; j < n && !g; j++)
        if (srcs[j]) g = srcs[j]->graph;
    /* beside an operand whose graph is healthy the NULL came from nowhere: nothing before it to quote */
    const char *before = !g ? deft_errmsg() : g->first_error != DEFT_OK ? g->first_errmsg : "";
    const char *cause = strstr(before, DEFT_NULL_CAUSE);
    cause = cause ? cause + strlen(DEFT_NULL_CAUSE) : before;
    if (*cause) deft_graph_fail(g, DEFT_ERR_INVALID, "%s: operand %d is NULL" DEFT_NULL_CAUSE "%s", op, i, cause);
    else deft_graph_fail(g, DEFT_ERR_INVALID, "%s: operand %d is NULL", op, i);
}

deft_graph *deft_srcs_graph(const char *op, int n, deft_tensor *const *srcs) {
    if (!srcs) {
        deft_set_error(DEFT_ERR_INVALID, "%s: no operands given (NULL)", op);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!srcs[i]) {
            deft_null_operand(op, n, srcs, i);
            return NULL;
        }
    deft_graph *g = srcs[0]->graph;
    for (int i = 1; i < n; i++) {
        if (srcs[i]->graph != g) {
            deft_graph_fail(g, DEFT_ERR_INVALID, "%s: inputs come from different graphs", op);
            return NULL;
        }
        if (!deft_device_equal(srcs[i]->device, srcs[0]->device)) {
            char a[32], b[32];
            deft_graph_fail(g, DEFT_ERR_DEVICE,
                            "%s: expected all tensors on the same device, found %s and %s; move one with deft_to",
                            op, deft_device_str(srcs[0]->device, a, sizeof a),
                            deft_device_str(srcs[i]->device, b, sizeof b));
            return NULL;
        }
    }
    return g;
}

bool deft_check_leaf(deft_graph *g, const char *what, deft_dtype dt, int ndim, const int64_t *shape,
                     deft_device dev) {
    if ((int)dt < 0 || dt >= DEFT_DTYPE_COUNT) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "%s: unsupported dtype %d", what, (int)dt);
        return false;
    }
    if (ndim < 0 || ndim > DEFT_MAX_DIMS) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: %d dimensions; deft supports 0 to %d", what, ndim, DEFT_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "%s: shape is NULL for %d dimensions", what, ndim);
        return false;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) {
            deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: dimension %d is %lld; sizes must be positive", what, i,
                            (long long)shape[i]);
            return false;
        }
    }
    if (!deft_check_size(g, what, dt, ndim, shape)) return false;
    deft_status s = deft_device_check(dev);
    if (s != DEFT_OK) {
        deft_graph_fail(g, s, "%s: %s", what, deft_errmsg());
        return false;
    }
    return true;
}

bool deft_check_size(deft_graph *g, const char *what, deft_dtype dt, int ndim, const int64_t *shape) {
    size_t bytes;
    if (deft_shape_bytes(ndim, shape, deft_dtype_size(dt), &bytes)) return true;
    char s[DEFT_MAX_DIMS * 24];
    deft_shape_str(ndim, shape, s, sizeof s);
    double elems = 1.0;   /* exact enough to say how far past the limit it is */
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: shape %s has dimension %d of %lld; sizes must not be negative",
                            what, s, i, (long long)shape[i]);
            return false;
        }
        elems *= (double)shape[i];
    }
    deft_graph_fail(g, DEFT_ERR_SHAPE,
                    "%s: shape %s of %s is too large: %.4g elements, %.4g bytes; a tensor may have at most %zu bytes",
                    what, s, deft_dtype_name(dt), elems, elems * (double)deft_dtype_size(dt), DEFT_MAX_BYTES);
    return false;
}

bool deft_norm_axis(deft_graph *g, const char *op, int axis, int ndim, int *out) {
    int a = axis < 0 ? axis + ndim : axis;
    if (a < 0 || a >= ndim) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: axis %d is out of range for a tensor of %d dimensions", op, axis,
                        ndim);
        return false;
    }
    *out = a;
    return true;
}

bool deft_require_float(deft_graph *g, const char *op, deft_dtype dt) {
    if (deft_dtype_is_float(dt)) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "%s: needs a floating dtype (f32, f64, f16, bf16), got %s", op,
                    deft_dtype_name(dt));
    return false;
}

deft_status deft_check_expand_shape(const deft_tensor *src, const deft_tensor *out) {
    bool ok = src->ndim <= out->ndim;
    for (int d = 0; ok && d < src->ndim; d++) {
        const int64_t sd = src->shape[d], od = out->shape[out->ndim - src->ndim + d];
        if (sd != 1 && sd != od) ok = false;
    }
    if (ok) return DEFT_OK;
    char as[96], bs[96];
    return deft_set_error(DEFT_ERR_SHAPE, "expand: %s does not broadcast to %s",
                          deft_shape_str(src->ndim, src->shape, as, sizeof as),
                          deft_shape_str(out->ndim, out->shape, bs, sizeof bs));
}
