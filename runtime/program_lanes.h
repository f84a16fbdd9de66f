/* The streams of a program that uses GPUs: one per GPU its nodes live on (a lane), and the events that order them.
 * runtime/program_lanes.c. The host is one more lane, of index n, for steps that run on the CPU.
 *
 * A step is queued on the lane of the device that does its work (a copy to the host on its source's GPU, any other
 * copy on its destination's). Before it, its lane waits for the lanes whose work on the same memory it must follow
 * (passes/lane_hazards.h: a copy waits for what produced its source; a GPU overwriting a buffer waits for the other
 * GPU's copy still reading it), recording an event there and waiting on it only where the lane changes: steps on
 * one GPU never wait on events. A run forks the lanes it uses from lane 0 and joins them back into it at its end, so
 * one run is one piece of work on lane 0's stream: it can be captured there as one CUDA Graph, and the next run
 * starts after it. A one-GPU program with side steps has a second lane on its GPU (passes/side_lane.h), ordered
 * by the same rules. */
#ifndef DEFT_PROGRAM_LANES_H
#define DEFT_PROGRAM_LANES_H

#include <stdbool.h>
#include <stdint.h>

#include "graph_internal.h"
#include "lane_hazards.h"

#define DEFT_STEP_RANGES 64   /* memory ranges listed per step; a step with more is taken to touch all its GPU's */

struct deft_program;

typedef struct deft_lanes {
    int n;                                   /* GPU lanes; 0 when no node of the program lives on a GPU */
    int device[DEFT_MAX_LANES];              /* lane 0: the GPU of the first GPU step, where captures begin */
    void *stream[DEFT_MAX_LANES];            /* cudaStream_t, blocking (ordered with the legacy stream's copies) */
    void *event[DEFT_MAX_LANES];             /* recorded on a lane when another lane, or the host, waits for it */
    void *fork;                              /* recorded on lane 0 as a run starts; other lanes wait on it first */
    int host_steps;                          /* steps that run on the CPU */
    int side;                                /* the side lane (passes/side_lane.h): a second stream of lane 0's GPU,
                                              * whose memory is lane 0's; 0 when the program has none */
    int n_side_events;
    void **side_events;                      /* [j]: recorded after the side lane's step j of a run, so that the main
                                              * stream waits for the one side step it must, not for all queued since */
    /* the run being queued */
    deft_hazards hazards;
    bool forked[DEFT_MAX_LANES];
    deft_range ranges[DEFT_STEP_RANGES];     /* what the step being queued touches */
    int n_ranges;
} deft_lanes;

/* 1 when some node p needs lives on a GPU: its CPU memory is then page-locked, for asynchronous copies. */
int deft_program_touches_gpu(const struct deft_program *p);

/* Finds the lanes of p, creates their streams and events, and enables peer access between their GPUs where the
 * GPUs allow it (copies work without it too, staged). No GPU work is queued. */
deft_status deft_lanes_init(struct deft_program *p);
/* Waits for what is queued, then destroys the streams and events. */
void deft_lanes_free(struct deft_program *p);

/* The lane step `id` runs on (L->n: the host). */
int deft_lanes_step_lane(const struct deft_program *p, int id);

/* Around the steps of a run: begin_run forks (and, when a step runs on the host, waits for the previous run),
 * before_step makes the step's lane wait where it must and gives its stream (NULL for the host), after_step notes
 * what the step queued touches, end_run joins the lanes used back into lane 0 (always: a capture must end joined). */
deft_status deft_lanes_begin_run(struct deft_program *p);
deft_status deft_lanes_before_step(struct deft_program *p, int id, void **stream);
deft_status deft_lanes_after_step(struct deft_program *p, int id);
deft_status deft_lanes_end_run(struct deft_program *p);

/* The host waits for the last run (all of it: it is joined into lane 0). */
deft_status deft_lanes_wait_idle(struct deft_program *p);

#endif
