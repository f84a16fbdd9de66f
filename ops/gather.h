/* The geometry the gather kernels of both backends share (ops/cpu/cpu_gather.c, ops/cuda/cuda_gather.cu): an
 * embedding, an index_select and their gradients are all out[o, j, c] = a[o, index[j], c] (or its transpose, a sum
 * of rows) over a tensor seen as [outer, rows, inner] and an index of n entries. Plain C. */
#ifndef DEFT_OPS_GATHER_H
#define DEFT_OPS_GATHER_H

#include <stdbool.h>
#include <string.h>

#include "graph_internal.h"

typedef struct deft_gather_dims {
    int64_t outer, rows, n, inner;
} deft_gather_dims;

/* Whether `like` is `base` with axis `ax` n long (all other dims equal). */
static inline bool deft_gather_shape_is(const deft_tensor *like, const deft_tensor *base, int ax, int64_t n) {
    if (like->ndim != base->ndim || ax < 0 || ax >= base->ndim || like->shape[ax] != n) return false;
    for (int d = 0; d < base->ndim; d++)
        if (d != ax && like->shape[d] != base->shape[d]) return false;
    return true;
}

/* The dims of gather node t (DEFT_OP_EMBEDDING, DEFT_OP_INDEX_SELECT or their gradients): `big` is the tensor rows
 * are taken from (or summed into), `small` the one of n rows. DEFT_ERR_SHAPE (with a message) when the shapes do
 * not fit, which the builders rule out. */
static inline deft_status deft_gather_dims_of(const deft_tensor *t, deft_gather_dims *d) {
    const bool grad = t->op == DEFT_OP_EMBEDDING_GRAD || t->op == DEFT_OP_INDEX_SELECT_GRAD;
    const deft_tensor *big = grad ? t : t->src[0], *small = grad ? t->src[0] : t, *idx = t->src[1];
    const bool embedding = t->op == DEFT_OP_EMBEDDING || t->op == DEFT_OP_EMBEDDING_GRAD;
    const int ax = embedding ? 0 : t->p.gather.axis;
    d->n = deft_shape_numel(idx->ndim, idx->shape);
    bool ok = idx->dtype == DEFT_I32 && small->dtype == big->dtype && ax >= 0 && ax < big->ndim;
    if (ok && embedding) {
        /* small is [ids..., C] */
        ok = big->ndim == 2 && small->ndim == idx->ndim + 1 && small->shape[idx->ndim] == big->shape[1] &&
             memcmp(small->shape, idx->shape, (size_t)idx->ndim * sizeof *idx->shape) == 0;
    } else if (ok) {
        ok = idx->ndim == 1 && deft_gather_shape_is(small, big, ax, d->n);
    }
    if (!ok) {
        char bs[96], ss[96], is[96];
        return deft_set_error(DEFT_ERR_SHAPE, "%s: %s %s, %s and index %s %s do not fit", deft_op_name(t->op),
                              deft_dtype_name(big->dtype), deft_shape_str(big->ndim, big->shape, bs, sizeof bs),
                              deft_shape_str(small->ndim, small->shape, ss, sizeof ss), deft_dtype_name(idx->dtype),
                              deft_shape_str(idx->ndim, idx->shape, is, sizeof is));
    }
    d->outer = deft_shape_numel(ax, big->shape);
    d->rows = big->shape[ax];
    d->inner = deft_shape_numel(big->ndim - ax - 1, big->shape + ax + 1);
    return DEFT_OK;
}

/* The order node's parts (DEFT_OP_INDEX_ORDER): P sorted keys, then rows + 1 first slots. */
static inline bool deft_index_order_fits(const deft_tensor *order, int64_t n, int64_t rows) {
    return order->op == DEFT_OP_INDEX_ORDER && order->dtype == DEFT_I32 && order->ndim == 1 &&
           order->shape[0] == 2 * deft_index_order_pad(n) + rows + 1;
}

/* The dims of gradient node t (DEFT_OP_EMBEDDING_GRAD or DEFT_OP_INDEX_SELECT_GRAD), whose src[2] is the order of
 * its index; keys and first are where the order's parts start in its buffer. DEFT_ERR_SHAPE when the shapes or the
 * order do not fit. */
static inline deft_status deft_gather_grad_dims_of(const deft_tensor *t, const void *order, deft_gather_dims *d,
                                                   const uint64_t **keys, const int32_t **first) {
    deft_status s = deft_gather_dims_of(t, d);
    if (s != DEFT_OK) return s;
    if (!deft_index_order_fits(t->src[2], d->n, d->rows))
        return deft_set_error(DEFT_ERR_SHAPE, "%s: the order node does not fit %lld indices into %lld rows",
                              deft_op_name(t->op), (long long)d->n, (long long)d->rows);
    *keys = (const uint64_t *)order;
    *first = (const int32_t *)(*keys + deft_index_order_pad(d->n));
    return DEFT_OK;
}

/* The message of an index outside [0, rows), the same on both backends and at build time. */
#define DEFT_GATHER_BAD_FMT "%s: %s %d at position %lld is outside [0, %lld)"
static inline const char *deft_gather_index_word(bool embedding) { return embedding ? "token id" : "index"; }

#endif
