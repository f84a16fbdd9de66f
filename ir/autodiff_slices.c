/* Gradients of slices that cut a tensor along one axis (q, k and v out of one projection): each slice's gradient is
 * a zero-padded tensor of the whole shape, and deft_backward adds them up. When every contribution to a tensor's
 * gradient is such a slice gradient, one concat of the slices' gradients (zeros in the gaps) gives the same values
 * while writing the tensor once, instead of once per slice plus once per add.
 *
 * The same values bit for bit: the adds give x + 0 for each element, which is x except that -0 becomes +0 (and a
 * NaN comes out quiet), so the concat is told to store x + 0 too (p.concat.add_zero). */
#include <stdlib.h>

#include "autodiff_rules.h"
#include "config.h"
#include "node.h"

/* More pieces than this keep the adds: a concat has one source per piece. */
#define DEFT_SLICE_JOIN_MAX 64

typedef struct deft_slice_piece {
    deft_tensor *dy;   /* the slice's gradient */
    int axis;
    int64_t start, len;
} deft_slice_piece;

/* Gathers the slice gradients under `t`, a tree of adds this backward pass built (ids >= first): false when any
 * node of it is something else, or when the pieces are not step-1 slices along one axis, of root's dtype. */
static bool deft_collect_pieces(const deft_tensor *t, const deft_tensor *root, int first, deft_slice_piece *p,
                                int *n) {
    if (t->id < first || t->dtype != root->dtype || t->ndim != root->ndim) return false;
    if (t->op == DEFT_OP_ADD && t->nsrc == 2)
        return deft_collect_pieces(t->src[0], root, first, p, n) && deft_collect_pieces(t->src[1], root, first, p, n);
    if (t->op != DEFT_OP_SLICE_GRAD || t->p.slice.step != 1 || *n == DEFT_SLICE_JOIN_MAX) return false;
    const int axis = t->p.slice.axis;
    if (axis < 0 || axis >= t->ndim || t->src[0]->dtype != root->dtype || (*n > 0 && axis != p[0].axis)) return false;
    p[*n] = (deft_slice_piece){t->src[0], axis, t->p.slice.start, t->src[0]->shape[axis]};
    (*n)++;
    return true;
}

static int deft_piece_cmp(const void *a, const void *b) {
    const deft_slice_piece *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Zeros of `like`'s shape but `len` long along axis. */
static deft_tensor *deft_gap_zeros(const deft_tensor *like, int axis, int64_t len) {
    int64_t shape[DEFT_MAX_DIMS];
    for (int d = 0; d < like->ndim; d++) shape[d] = d == axis ? len : like->shape[d];
    return deft_zeros(like->graph, like->dtype, like->ndim, shape, like->device);
}

/* The concat of the sorted, disjoint pieces with zeros in the gaps, or NULL when they overlap or overrun. */
static deft_tensor *deft_join_pieces(const deft_tensor *root, const deft_slice_piece *p, int n) {
    const int axis = p[0].axis;
    const int64_t extent = root->shape[axis];
    deft_tensor *parts[2 * DEFT_SLICE_JOIN_MAX + 1];
    int np = 0;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].start < at || p[i].len > extent - p[i].start) return NULL;
        if (p[i].start > at) parts[np++] = deft_gap_zeros(root, axis, p[i].start - at);
        parts[np++] = p[i].dy;
        at = p[i].start + p[i].len;
    }
    if (at < extent) parts[np++] = deft_gap_zeros(root, axis, extent - at);
    for (int i = 0; i < np; i++)
        if (!parts[i]) return NULL;
    deft_tensor *c = deft_concat(parts, np, axis);
    if (!c || c->op != DEFT_OP_CONCAT) return NULL;
    c->p.concat.add_zero = 1;
    return c;
}

deft_tensor *deft_join_slice_grads(deft_tensor *grad, int first) {
    if (!grad || grad->op != DEFT_OP_ADD || deft_debug(DEFT_DEBUG_SLICE_GRAD_ADDS)) return grad;
    deft_slice_piece p[DEFT_SLICE_JOIN_MAX];
    int n = 0;
    if (!deft_collect_pieces(grad, grad, first, p, &n) || n < 2) return grad;
    qsort(p, (size_t)n, sizeof *p, deft_piece_cmp);
    deft_tensor *c = deft_join_pieces(grad, p, n);
    return c ? c : grad;
}
