/* The CPU backend: one entry point that runs a node's kernel. */
#ifndef DEFT_CPU_KERNELS_H
#define DEFT_CPU_KERNELS_H

#include "graph_internal.h"

/* Runs node n: `out` is a contiguous buffer of n's shape and dtype, in[i] a contiguous buffer of n->src[i]'s.
 * Never called for leaves, views (reshape, contiguous slices) or DEFT_OP_COPY, which the executor handles.
 * Returns DEFT_ERR_DTYPE (with a message) for a dtype the op does not support on the CPU. */
deft_status deft_cpu_run_node(const deft_tensor *n, void *out, const void *const *in);

/* 1 if matmul goes through a CBLAS. */
int deft_cpu_has_blas(void);

#endif
