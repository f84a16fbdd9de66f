/* Running an optimizer's node (runtime/optimizer_run.c). */
#ifndef DEFT_OPTIMIZER_RUN_H
#define DEFT_OPTIMIZER_RUN_H

#include "optimizer.h"

/* Runs a step node of o (or of a part of it): srcs are the node's sources, grads[i] the value of srcs[i], out its
 * value (the norm; a piece's block sums). The CPU runs it at once; a GPU queues it on `stream` (NULL: the legacy
 * stream). */
deft_status deft_optimizer_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads, void *out,
                               void *stream);

/* The GPU's run (runtime/optimizer_tables_cuda.c): its gather table found or built, then its kernel. A new set of
 * gradient addresses builds a table, which waits for the stream and is refused while it captures a CUDA Graph. */
deft_status deft_optimizer_cuda_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads, void *out,
                                    void *stream);

#endif
