/* Optimizers' flat storage and device state (runtime/optimizer_storage.c). */
#ifndef DEFT_OPTIMIZER_STORAGE_H
#define DEFT_OPTIMIZER_STORAGE_H

#include "optimizer.h"

/* Gives every optimizer of g whose step node exists, and has none yet, its storage; called first by each compile, so
 * that the autocast rewrite's scale seeds and the plan see the flat block. A failure leaves the others as they were. */
deft_status deft_optimizers_materialize(deft_graph *g);
/* The graph hook: frees an optimizer's storage once the device finished the steps that read it. */
void deft_optimizer_release(deft_optimizer *opt);

#endif
