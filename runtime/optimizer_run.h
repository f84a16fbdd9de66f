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

/* The gather table a GPU step node of o will read for grads (as deft_optimizer_cuda_run's), built at compile: building
 * copies from pageable host memory and waits for the stream, which a data-parallel replica's first run must not do
 * while its peers' collectives wait for it. Nothing to build (a sharded step of several ranks), or checks its run
 * would fail, leave it to the run. */
deft_status deft_optimizer_cuda_prepare(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                        void *stream);

#endif
