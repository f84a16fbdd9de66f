/* The compile pipeline: named stages run in order on a new program, each leaving it in a state that the plan print
 * and the DOT dump show (so each can be looked at alone: the compile option stop_after). The stages:
 *   autocast         the graph's autocast rewrite (compile option autocast), the outputs mapped into it
 *   checkpoint       activation checkpointing's rewrite (checkpoint.h), its search measuring through later stages
 *   optimizer_split  optimizer steps split into pieces (optimizer_split.h)
 *   schedule         what the outputs need, the steps in id order, their buffers and the arenas' plan
 *   reorder          the steps reordered to lower the peak (compile option reorder), kept when the arenas shrink
 *   fusion           fused kernels (fusion.c; on a GPU), product batches among them
 *   optimizer_place  the optimizer's pieces moved up to their gradients (optimizer_place.h)
 *   side_lane        the steps that run on a GPU's second stream (side_lane.h)
 *   budget           the plan checked against the memory budget
 * A stage that changes the order, the groups or what lives how long plans the memory again, so the plan after each
 * stage is what the program would run with were it the last. The runtime (runtime/program.c) allocates and runs
 * only a program that went through every stage. */
#ifndef DEFT_PIPELINE_H
#define DEFT_PIPELINE_H

#include "program_state.h"

int deft_pipeline_stage_count(void);
/* Stage i's name; NULL out of range. */
const char *deft_pipeline_stage_name(int i);
/* The index of the stage of that name, -1 for none. */
int deft_pipeline_stage_find(const char *name);

/* Runs the stages 0 .. p->config.last_stage on p (a new program of g = p->graph, p->config resolved) for the
 * outputs asked for; past its last stage p->stopped_after names it. */
deft_status deft_pipeline_run(deft_program *p, deft_tensor *const *outputs, int n_outputs);

#endif
