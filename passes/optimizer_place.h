/* Optimizer in backward: where the pieces of a split step run (passes/optimizer_split.h). */
#ifndef DEFT_OPTIMIZER_PLACE_H
#define DEFT_OPTIMIZER_PLACE_H

#include <stdbool.h>

#include "graph_internal.h"

struct deft_program;

/* Moves each piece of a split optimizer step in p->steps to just after the last step that gives one of its gradients
 * or reads one of its parameters (through views, and for a fused member at its group's step), in p->steps's order as
 * last scheduled: the ordering edges a piece must follow, explicit. Pieces anchored at one step keep their order;
 * nothing else moves. Data parallel's pieces per bucket go after every other step instead, in their order. *moved
 * says whether the order changed (the plan must then be made again). */
deft_status deft_program_place_parts(struct deft_program *p, bool *moved);

#endif
