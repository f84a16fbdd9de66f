/* A GPU's second stream, the side lane: the steps of a one-GPU program that the main stream never waits for before
 * the optimizer's step (a layer's weight gradient, and what only turns it into what the optimizer reads), so that
 * they run beside the input gradients of the layers below instead of after them. passes/side_lane.c.
 *
 * A convolution or product of a small batch does not fill a large GPU alone (cuBLAS and cuDNN split the inner
 * dimension to make enough blocks, and pay for the split); two independent ones at once fill it better, and ResNet-18's
 * steps got shorter (bench/RESULTS.md, "Eighth round"). Which products qualify is measured, not assumed (side_lane.c).
 *
 * Ordering (runtime/program_lanes.c, passes/lane_hazards.h): the side lane is one more lane of the same GPU, whose
 * memory stays the main lane's. A side step waits for everything the main stream queued before it; a main step waits
 * for the side lane where it reads what a side step wrote or overwrites what one read, and then only for that side
 * step (each records an event); the optimizer's step, which writes everything, waits for all of it; the run joins
 * the side lane back into the main stream at its end. So that those waits stay rare, the planner keeps a side step's
 * inputs alive until two side steps later. The side lane's stream has smaller cuBLAS and cuDNN scratch
 * (mem/cuda_workspace.h), its algorithms chosen to fit. */
#ifndef DEFT_SIDE_LANE_H
#define DEFT_SIDE_LANE_H

#include "graph_internal.h"

struct deft_program;

/* Marks the side steps of p (p->nodes[root].side) over its final order and groups, and says in *count how many there
 * are (DEFT_ERR_OOM when the host is out of memory). None unless every step runs on one GPU, the program splits no
 * optimizer (optimizer_in_backward, data parallel's pieces per bucket), has no memory budget or checkpointing, and
 * the compile option no_side_lane is not set (p->config.side_lane). A data-parallel replica's buckets wait for both
 * lanes before their all-reduce (dist/dist_program.c). */
deft_status deft_side_mark(struct deft_program *p, int *count);

/* Part of the schedule (runtime/program.c): the buffers that side steps read live on until DEFT_SIDE_KEEP side steps
 * later (or to the end), so that the main stream, running ahead, does not write over them while they are read.
 * DEFT_ERR_OOM when scratch memory runs out. */
deft_status deft_side_keep_inputs(struct deft_program *p);

#endif
