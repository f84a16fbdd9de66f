/* Builders that change shapes: matmul, reshape, permute, slice, concat. */
#include <string.h>

#include "checked.h"
#include "node.h"

deft_tensor *deft_matmul_t(deft_tensor *a, deft_tensor *b, int trans_a, int trans_b) {
    deft_tensor *srcs[2] = {a, b};
    deft_graph *g = deft_srcs_graph("matmul", 2, srcs);
    if (!g) return NULL;
    char sa[128], sb[128];
    if (a->ndim < 2 || b->ndim < 2) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "matmul: needs at least 2 dimensions, got a %s and b %s",
                        deft_shape_str(a->ndim, a->shape, sa, sizeof sa),
                        deft_shape_str(b->ndim, b->shape, sb, sizeof sb));
        return NULL;
    }
    if (a->dtype != b->dtype) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "matmul: dtypes %s and %s differ", deft_dtype_name(a->dtype),
                        deft_dtype_name(b->dtype));
        return NULL;
    }
    if (!deft_require_float(g, "matmul", a->dtype)) return NULL;
    int64_t m = a->shape[a->ndim - (trans_a ? 1 : 2)], ka = a->shape[a->ndim - (trans_a ? 2 : 1)];
    int64_t kb = b->shape[b->ndim - (trans_b ? 1 : 2)], n = b->shape[b->ndim - (trans_b ? 2 : 1)];
    if (ka != kb) {
        deft_graph_fail(g, DEFT_ERR_SHAPE,
                        "matmul: inner dimensions differ: a is %s%s (K = %lld), b is %s%s (K = %lld)",
                        deft_shape_str(a->ndim, a->shape, sa, sizeof sa), trans_a ? " transposed" : "",
                        (long long)ka, deft_shape_str(b->ndim, b->shape, sb, sizeof sb),
                        trans_b ? " transposed" : "", (long long)kb);
        return NULL;
    }
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    deft_status s = deft_shape_broadcast(a->ndim - 2, a->shape, b->ndim - 2, b->shape, &ndim, shape);
    if (s != DEFT_OK) {
        deft_graph_fail(g, s, "matmul: batch dimensions: %s", deft_errmsg());
        return NULL;
    }
    shape[ndim++] = m;
    shape[ndim++] = n;
    deft_tensor *t = deft_node_new(g, DEFT_OP_MATMUL, a->dtype, a->device, ndim, shape, 2, srcs);
    if (t) {
        t->p.matmul.trans_a = trans_a != 0;
        t->p.matmul.trans_b = trans_b != 0;
    }
    return t;
}

deft_tensor *deft_matmul(deft_tensor *a, deft_tensor *b) { return deft_matmul_t(a, b, 0, 0); }

/* A view shares src's storage; views of views point at the same base with their offsets added. */
static deft_tensor *deft_make_view(deft_tensor *t, size_t offset) {
    if (!t) return NULL;
    t->is_view = true;
    t->view_offset = offset;
    return t;
}

deft_tensor *deft_reshape(deft_tensor *a, int ndim, const int64_t *shape) {
    deft_graph *g = deft_srcs_graph("reshape", 1, &a);
    if (!g) return NULL;
    if (ndim < 0 || ndim > DEFT_MAX_DIMS || (ndim > 0 && !shape)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "reshape: %d dimensions; deft supports 0 to %d", ndim, DEFT_MAX_DIMS);
        return NULL;
    }
    int64_t out[DEFT_MAX_DIMS], known = 1;
    int infer = -1;
    bool fits = true;   /* a product of the given sizes past int64 cannot be a's count, which fits */
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] <= 0) {
            deft_graph_fail(g, DEFT_ERR_SHAPE, "reshape: dimension %d is %lld; sizes must be positive (one may be -1)",
                            i, (long long)shape[i]);
            return NULL;
        } else {
            fits = fits && deft_i64_mul(known, shape[i], &known);
        }
    }
    const int64_t numel = deft_shape_numel(a->ndim, a->shape);
    fits = fits && (infer >= 0 ? numel % known == 0 : known == numel);
    if (fits && infer >= 0) out[infer] = numel / known;
    char sa[128], sb[128];
    if (!fits) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "reshape: %s (%lld elements) cannot become %s",
                        deft_shape_str(a->ndim, a->shape, sa, sizeof sa), (long long)numel,
                        deft_shape_str(ndim, shape, sb, sizeof sb));
        return NULL;
    }
    return deft_make_view(deft_node_new(g, DEFT_OP_RESHAPE, a->dtype, a->device, ndim, out, 1, &a), 0);
}

deft_tensor *deft_view(deft_tensor *a, int ndim, const int64_t *shape) { return deft_reshape(a, ndim, shape); }

deft_tensor *deft_permute(deft_tensor *a, const int *perm) {
    deft_graph *g = deft_srcs_graph("permute", 1, &a);
    if (!g) return NULL;
    if (!perm) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "permute: perm is NULL");
        return NULL;
    }
    int seen[DEFT_MAX_DIMS] = {0};
    int64_t shape[DEFT_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= a->ndim || seen[perm[i]]++) {
            deft_graph_fail(g, DEFT_ERR_SHAPE, "permute: perm is not a permutation of 0..%d (entry %d is %d)",
                            a->ndim - 1, i, perm[i]);
            return NULL;
        }
        shape[i] = a->shape[perm[i]];
    }
    bool identity = true;
    for (int i = 0; i < a->ndim; i++) identity = identity && perm[i] == i;
    if (identity) return a;
    deft_tensor *t = deft_node_new(g, DEFT_OP_PERMUTE, a->dtype, a->device, a->ndim, shape, 1, &a);
    if (t) memcpy(t->p.perm, perm, (size_t)a->ndim * sizeof *perm);
    return t;
}

deft_tensor *deft_transpose(deft_tensor *a, int axis0, int axis1) {
    deft_graph *g = deft_srcs_graph("transpose", 1, &a);
    int x, y;
    if (!g || !deft_norm_axis(g, "transpose", axis0, a->ndim, &x) ||
        !deft_norm_axis(g, "transpose", axis1, a->ndim, &y))
        return NULL;
    int perm[DEFT_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) perm[i] = i;
    perm[x] = y;
    perm[y] = x;
    return deft_permute(a, perm);
}

static int64_t deft_clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

deft_tensor *deft_slice(deft_tensor *a, int axis, int64_t start, int64_t end, int64_t step) {
    deft_graph *g = deft_srcs_graph("slice", 1, &a);
    int ax;
    if (!g || !deft_norm_axis(g, "slice", axis, a->ndim, &ax)) return NULL;
    if (step <= 0) {
        deft_graph_fail(g, DEFT_ERR_INVALID, "slice: step %lld must be positive", (long long)step);
        return NULL;
    }
    int64_t dim = a->shape[ax];
    int64_t s = deft_clamp(start < 0 ? start + dim : start, 0, dim);
    int64_t e = deft_clamp(end < 0 ? end + dim : end, 0, dim);
    int64_t count = e > s ? (e - s - 1) / step + 1 : 0;   /* rounds up without adding step, which may be huge */
    if (count == 0) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "slice: [%lld:%lld:%lld] of axis %d (size %lld) is empty",
                        (long long)start, (long long)end, (long long)step, ax, (long long)dim);
        return NULL;
    }
    int64_t shape[DEFT_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[ax] = count;
    if (count == dim) return a;
    deft_tensor *t = deft_node_new(g, DEFT_OP_SLICE, a->dtype, a->device, a->ndim, shape, 1, &a);
    if (!t) return NULL;
    t->p.slice.axis = ax;
    t->p.slice.start = s;
    t->p.slice.step = step;
    /* Contiguous in the source when every dimension before the axis has size 1 and the elements are adjacent. */
    int64_t outer = deft_shape_numel(ax, a->shape);
    if (outer == 1 && (step == 1 || count == 1)) {
        int64_t strides[DEFT_MAX_DIMS];
        deft_shape_strides(a->ndim, a->shape, strides);
        t->p.slice.is_view = 1;
        deft_make_view(t, (size_t)(s * strides[ax]) * deft_dtype_size(a->dtype));
    }
    return t;
}

deft_tensor *deft_concat(deft_tensor *const *ts, int n, int axis) {
    if (n <= 0 || !ts) {
        deft_set_error(DEFT_ERR_INVALID, "concat: needs at least one tensor");
        return NULL;
    }
    deft_graph *g = deft_srcs_graph("concat", n, ts);
    int ax;
    if (!g || !deft_norm_axis(g, "concat", axis, ts[0]->ndim, &ax)) return NULL;
    int64_t shape[DEFT_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof shape);
    shape[ax] = 0;
    for (int i = 0; i < n; i++) {
        const deft_tensor *t = ts[i];
        bool fits = t->ndim == ts[0]->ndim && t->dtype == ts[0]->dtype;
        for (int d = 0; fits && d < t->ndim; d++) fits = d == ax || t->shape[d] == ts[0]->shape[d];
        if (!fits) {
            char s0[128], si[128];
            deft_graph_fail(g, DEFT_ERR_SHAPE, "concat: tensor %d is %s %s, tensor 0 is %s %s (axis %d)", i,
                            deft_dtype_name(t->dtype), deft_shape_str(t->ndim, t->shape, si, sizeof si),
                            deft_dtype_name(ts[0]->dtype),
                            deft_shape_str(ts[0]->ndim, ts[0]->shape, s0, sizeof s0), ax);
            return NULL;
        }
        if (!deft_i64_add(shape[ax], t->shape[ax], &shape[ax])) {
            char s0[128];
            deft_graph_fail(g, DEFT_ERR_SHAPE, "concat: the sizes along axis %d add up past %lld at tensor %d (%s)", ax,
                            (long long)INT64_MAX, i, deft_shape_str(t->ndim, t->shape, s0, sizeof s0));
            return NULL;
        }
    }
    if (n == 1) return ts[0];
    deft_tensor *t = deft_node_new(g, DEFT_OP_CONCAT, ts[0]->dtype, ts[0]->device, ts[0]->ndim, shape, n, ts);
    if (t) t->p.axis = ax;
    return t;
}
