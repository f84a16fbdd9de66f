/* The schedule of a program and the plan of its memory: which nodes run, each step's buffer and lifetime, in-place
 * reuse, and the arenas' offsets for the current order of p->steps. The pipeline's stages (pipeline.h) call these
 * again whenever they change the order or the groups. */
#ifndef DEFT_SCHEDULE_H
#define DEFT_SCHEDULE_H

#include "program_state.h"

/* Allocates p's per-node state and outputs and marks what the outputs need (an output that a rewrite copied is
 * computed by its copy, redirect[id], and read from there; redirect may be NULL); then collects the steps, the
 * nodes that run a kernel, in id order (a topological order). */
deft_status deft_schedule_prepare(deft_program *p, deft_tensor *const *outputs, int n_outputs, const int *redirect);

/* Gives each step (in the order of p->steps) its buffer, and each buffer its lifetime: until its last reader, views
 * being read through their base; outputs live to the end. */
deft_status deft_schedule_buffers(deft_program *p);

/* Buffers, in-place reuse and offsets for the current order of p->steps (p->config.no_reuse: no reuse at all). */
deft_status deft_plan_pass(deft_program *p);

/* Buffers and in-place reuse for the current order, with optimizer pieces placed, and each arena's lower bound
 * without placing anything: a cheaper measure than deft_plan_pass (checkpointing's search). */
deft_status deft_bound_pass(deft_program *p);

/* The planned arenas' bytes, summed over devices; SIZE_MAX past DEFT_MAX_BYTES (base/checked.h). */
size_t deft_arena_total(const deft_program *p);

/* Inputs, parameters, constants and optimizer state that the program needs; SIZE_MAX past DEFT_MAX_BYTES. */
size_t deft_persistent_bytes(const deft_program *p);

#endif
