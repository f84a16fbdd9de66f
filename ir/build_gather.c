/* Builders for gathers and selection: embedding, index_select and their gradients (through an index_order node
 * that fixes the order in which rows are summed), where and masked_fill. */
#include <string.h>

#include "build_grad_ops.h"
#include "checked.h"
#include "node.h"

/* The index of a gather: i32. */
static bool deft_check_index_dtype(deft_graph *g, const char *op, const char *what, const deft_tensor *idx) {
    if (idx->dtype == DEFT_I32) return true;
    deft_graph_fail(g, DEFT_ERR_DTYPE, "%s: %s must be i32, got %s", op, what, deft_dtype_name(idx->dtype));
    return false;
}

/* The index's values when they are known now: a constant, or a view of one (a reshape); NULL otherwise. */
static const int32_t *deft_known_index(const deft_tensor *idx) {
    size_t off = 0;
    while (idx->is_view) {
        off += idx->view_offset;
        idx = idx->src[0];
    }
    if (idx->op != DEFT_OP_CONSTANT || !idx->host_data) return NULL;
    return (const int32_t *)((const char *)idx->host_data + off);
}

/* A constant index outside [0, rows) fails now, with the message the kernels give at run time. */
static bool deft_check_known_index(deft_graph *g, const char *op, const deft_tensor *idx, int64_t rows,
                                   bool embedding) {
    const int32_t *v = deft_known_index(idx);
    if (!v) return true;
    const int64_t n = deft_shape_numel(idx->ndim, idx->shape);
    for (int64_t j = 0; j < n; j++) {
        if (v[j] >= 0 && v[j] < rows) continue;
        char s[96];
        deft_graph_fail(g, DEFT_ERR_INVALID, "%s: %s %d at position %lld is outside [0, %lld) (the constant %s %s)", op,
                        embedding ? "token id" : "index", (int)v[j], (long long)j, (long long)rows,
                        embedding ? "ids" : "index", deft_shape_str(idx->ndim, idx->shape, s, sizeof s));
        return false;
    }
    return true;
}

deft_tensor *deft_embedding(deft_tensor *table, deft_tensor *ids) {
    deft_tensor *srcs[2] = {table, ids};
    deft_graph *g = deft_srcs_graph("embedding", 2, srcs);
    if (!g || !deft_require_float(g, "embedding", table->dtype) ||
        !deft_check_index_dtype(g, "embedding", "ids (token indices)", ids))
        return NULL;
    char ts[96], is[96];
    if (table->ndim != 2 || ids->ndim + 1 > DEFT_MAX_DIMS) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "embedding: table %s and ids %s: expected a table [V, C] and ids of at most "
                        "%d dimensions", deft_shape_str(table->ndim, table->shape, ts, sizeof ts),
                        deft_shape_str(ids->ndim, ids->shape, is, sizeof is), DEFT_MAX_DIMS - 1);
        return NULL;
    }
    if (!deft_check_known_index(g, "embedding", ids, table->shape[0], true)) return NULL;
    int64_t shape[DEFT_MAX_DIMS];
    memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
    shape[ids->ndim] = table->shape[1];
    return deft_node_new(g, DEFT_OP_EMBEDDING, table->dtype, table->device, ids->ndim + 1, shape, 2, srcs);
}

deft_tensor *deft_index_select(deft_tensor *a, int axis, deft_tensor *index) {
    deft_tensor *srcs[2] = {a, index};
    deft_graph *g = deft_srcs_graph("index_select", 2, srcs);
    if (!g || !deft_check_index_dtype(g, "index_select", "index", index)) return NULL;
    char as[96], is[96];
    if (a->ndim < 1 || index->ndim != 1) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "index_select: input %s and index %s: expected an input of at least 1 "
                        "dimension and a 1-D index", deft_shape_str(a->ndim, a->shape, as, sizeof as),
                        deft_shape_str(index->ndim, index->shape, is, sizeof is));
        return NULL;
    }
    int ax;
    if (!deft_norm_axis(g, "index_select", axis, a->ndim, &ax) ||
        !deft_check_known_index(g, "index_select", index, a->shape[ax], false))
        return NULL;
    int64_t shape[DEFT_MAX_DIMS];
    memcpy(shape, a->shape, (size_t)a->ndim * sizeof *shape);
    shape[ax] = index->shape[0];
    deft_tensor *t = deft_node_new(g, DEFT_OP_INDEX_SELECT, a->dtype, a->device, a->ndim, shape, 2, srcs);
    if (t) t->p.gather.axis = ax;
    return t;
}

/* The positions of idx sorted by (value, position), and each value's first slot: what the gradients sum by. */
static deft_tensor *deft_index_order(deft_tensor *idx, int64_t rows, bool embedding) {
    deft_graph *g = idx->graph;
    const int64_t n = deft_shape_numel(idx->ndim, idx->shape);
    int64_t words;
    /* Positions and slots are 32-bit in the kernels. */
    if (n > INT32_MAX || rows >= INT32_MAX || !deft_i64_mul(deft_index_order_pad(n), 2, &words) ||
        !deft_i64_add(words, rows + 1, &words)) {
        deft_graph_fail(g, DEFT_ERR_SHAPE, "%s: the gradient over %lld indices into %lld rows needs more than 2^31 of "
                        "either", embedding ? "embedding" : "index_select", (long long)n, (long long)rows);
        return NULL;
    }
    deft_tensor *t = deft_node_new(g, DEFT_OP_INDEX_ORDER, DEFT_I32, idx->device, 1, &words, 1, &idx);
    if (t) {
        t->p.gather.rows = rows;
        t->p.gather.embedding = embedding;
    }
    return t;
}

deft_tensor *deft_embedding_grad(deft_tensor *dy, const deft_tensor *embedding) {
    deft_tensor *table = embedding->src[0], *ids = embedding->src[1];
    deft_tensor *srcs[3] = {dy, ids, NULL};
    if (!deft_srcs_graph("embedding_grad", 2, srcs)) return NULL;
    srcs[2] = deft_index_order(ids, table->shape[0], true);
    if (!srcs[2]) return NULL;
    return deft_node_new(dy->graph, DEFT_OP_EMBEDDING_GRAD, dy->dtype, dy->device, 2, table->shape, 3, srcs);
}

deft_tensor *deft_index_select_grad(deft_tensor *dy, const deft_tensor *index_select) {
    const deft_tensor *a = index_select->src[0];
    deft_tensor *srcs[3] = {dy, index_select->src[1], NULL};
    if (!deft_srcs_graph("index_select_grad", 2, srcs)) return NULL;
    const int ax = index_select->p.gather.axis;
    srcs[2] = deft_index_order(srcs[1], a->shape[ax], false);
    if (!srcs[2]) return NULL;
    deft_tensor *t = deft_node_new(dy->graph, DEFT_OP_INDEX_SELECT_GRAD, dy->dtype, dy->device, a->ndim, a->shape, 3,
                                   srcs);
    if (t) t->p.gather.axis = ax;
    return t;
}

deft_tensor *deft_where(deft_tensor *cond, deft_tensor *a, deft_tensor *b) {
    deft_tensor *srcs[3] = {cond, a, b};
    deft_graph *g = deft_srcs_graph("where", 3, srcs);
    if (!g) return NULL;
    if (a->dtype != b->dtype) {
        deft_graph_fail(g, DEFT_ERR_DTYPE, "where: a is %s and b is %s; they must share a dtype (cast one with "
                        "deft_cast)", deft_dtype_name(a->dtype), deft_dtype_name(b->dtype));
        return NULL;
    }
    int nab, ndim;
    int64_t ab[DEFT_MAX_DIMS], shape[DEFT_MAX_DIMS];
    if (deft_shape_broadcast(a->ndim, a->shape, b->ndim, b->shape, &nab, ab) != DEFT_OK ||
        deft_shape_broadcast(cond->ndim, cond->shape, nab, ab, &ndim, shape) != DEFT_OK) {
        char cs[96], as[96], bs[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "where: cond %s, a %s and b %s do not broadcast to one shape",
                        deft_shape_str(cond->ndim, cond->shape, cs, sizeof cs),
                        deft_shape_str(a->ndim, a->shape, as, sizeof as),
                        deft_shape_str(b->ndim, b->shape, bs, sizeof bs));
        return NULL;
    }
    return deft_node_new(g, DEFT_OP_WHERE, a->dtype, a->device, ndim, shape, 3, srcs);
}

deft_tensor *deft_masked_fill(deft_tensor *a, deft_tensor *mask, double value) {
    deft_tensor *srcs[2] = {a, mask};
    deft_graph *g = deft_srcs_graph("masked_fill", 2, srcs);
    if (!g) return NULL;
    int ndim;
    int64_t shape[DEFT_MAX_DIMS];
    if (deft_shape_broadcast(mask->ndim, mask->shape, a->ndim, a->shape, &ndim, shape) != DEFT_OK ||
        ndim != a->ndim || memcmp(shape, a->shape, (size_t)ndim * sizeof *shape) != 0) {
        char ms[96], as[96];
        deft_graph_fail(g, DEFT_ERR_SHAPE, "masked_fill: mask %s does not broadcast to a %s",
                        deft_shape_str(mask->ndim, mask->shape, ms, sizeof ms),
                        deft_shape_str(a->ndim, a->shape, as, sizeof as));
        return NULL;
    }
    deft_tensor *t = deft_node_new(g, DEFT_OP_MASKED_FILL, a->dtype, a->device, a->ndim, a->shape, 2, srcs);
    if (t) t->p.scalar = value;
    return t;
}
