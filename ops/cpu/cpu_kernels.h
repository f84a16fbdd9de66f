/* The CPU backend: one entry point that runs a node's kernel. */
#ifndef DEFT_CPU_KERNELS_H
#define DEFT_CPU_KERNELS_H

#include "graph_internal.h"

/* Runs node n: `out` is a contiguous buffer of n's shape and dtype, in[i] a contiguous buffer of n->src[i]'s.
 * Never called for leaves, views (reshape, contiguous slices) or DEFT_OP_COPY, which the executor handles.
 * Returns DEFT_ERR_DTYPE (with a message) for a dtype the op does not support on the CPU. */
deft_status deft_cpu_run_node(const deft_tensor *n, void *out, const void *const *in);

struct deft_optimizer;
/* An optimizer's whole step on the CPU (ops/cpu/cpu_optimizer.c): gathers this run's gradients (grads[i], the value
 * of srcs[i]) and every accumulate_steps-th run clips and updates; out is the norm. */
deft_status deft_cpu_optimizer_run(struct deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                   void *out);
/* A part of a split step: a piece's block sums into out, or the finisher's norm from the pieces' sums. */
deft_status deft_cpu_optimizer_part_run(struct deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                        void *out);
/* The parameters' whole low-precision copy written from their values (ir/optimizer.h's flat_low). */
void deft_cpu_optimizer_copy_refresh(const struct deft_optimizer *o);


#endif
