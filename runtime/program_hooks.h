/* What the runtime gives the IR (ir/graph_hooks.h). */
#ifndef DEFT_PROGRAM_HOOKS_H
#define DEFT_PROGRAM_HOOKS_H

#include "graph_hooks.h"

extern const deft_graph_hooks deft_runtime_graph_hooks;
/* Frees a parameter's or constant's device copy. */
void deft_release_device_data(deft_tensor *t);

#endif
