/* Node creation and the checks every builder shares. */
#ifndef DEFT_NODE_H
#define DEFT_NODE_H

#include "graph_internal.h"

/* Appends a node to g; on failure records the error in g and returns NULL. */
deft_tensor *deft_node_new(deft_graph *g, deft_op op, deft_dtype dt, deft_device dev, int ndim,
                           const int64_t *shape, int nsrc, deft_tensor *const *src);
void deft_node_destroy(deft_tensor *t);

/* Refills a parameter's host value from U(-bound, bound) (a linear layer's bias depends on the weight's fan-in). */
void deft_param_fill_uniform(deft_tensor *t, double bound);

/* The graph shared by srcs, or NULL: silently when one is NULL (an earlier builder failed and said why), with an
 * error when they come from different graphs or sit on different devices. */
deft_graph *deft_srcs_graph(const char *op, int n, deft_tensor *const *srcs);
/* Checks a leaf's dtype, rank and dimensions (all positive), its size (deft_check_size) and its device; records the
 * error in g. */
bool deft_check_leaf(deft_graph *g, const char *what, deft_dtype dt, int ndim, const int64_t *shape,
                     deft_device dev);
/* DEFT_ERR_SHAPE (recorded in g, naming `what` and the shape) unless every dimension is >= 0, the element count fits
 * int64 and the bytes fit DEFT_MAX_BYTES. Every node passes it, so deft_tensor_bytes of a node never wraps. */
bool deft_check_size(deft_graph *g, const char *what, deft_dtype dt, int ndim, const int64_t *shape);
/* Normalises a possibly negative axis into [0, ndim); records an error and returns false when out of range. */
bool deft_norm_axis(deft_graph *g, const char *op, int axis, int ndim, int *out);
/* DEFT_ERR_DTYPE unless dt is a floating dtype. */
bool deft_require_float(deft_graph *g, const char *op, deft_dtype dt);

static inline bool deft_dtype_is_float(deft_dtype dt) {
    return dt == DEFT_F32 || dt == DEFT_F64 || dt == DEFT_F16 || dt == DEFT_BF16;
}

#endif
