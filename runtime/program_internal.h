/* What a compiled program exposes to the rest of the library (DOT dump, reports). */
#ifndef DEFT_PROGRAM_INTERNAL_H
#define DEFT_PROGRAM_INTERNAL_H

#include "graph_internal.h"

/* Where a node's value lives in a compiled program. */
typedef enum deft_placement {
    DEFT_PLACE_NONE = 0,     /* not computed by this program */
    DEFT_PLACE_PERSISTENT,   /* input, parameter or constant storage */
    DEFT_PLACE_ARENA,        /* a planned range of the device's arena */
    DEFT_PLACE_VIEW,         /* aliases another node's storage */
    DEFT_PLACE_FUSED         /* computed inside a fused kernel and never stored */
} deft_placement;

typedef struct deft_node_plan {
    deft_placement place;
    int step;                /* position in the schedule, -1 if not scheduled */
    size_t offset, size;     /* arena range of its buffer (for views: the base's buffer, offset included) */
    int first, last;         /* lifetime of its buffer in steps */
    int buffer;              /* its buffer's index (nodes that ran in place, and views, share one); -1 if none */
    int is_output;
    int group;               /* the fused group computing it (runtime/fusion.c), -1 if none */
    int dropped;             /* checkpointing: its saved value is dropped after the forward pass */
    int recompute;           /* checkpointing: it is a recomputation, in the backward pass, of a dropped value */
    int side;                /* its step runs on the GPU's side lane (runtime/side_lane.h) */
} deft_node_plan;

/* Fills *out for node t; DEFT_PLACE_NONE if p does not compute t. */
void deft_program_node_plan(const deft_program *p, const deft_tensor *t, deft_node_plan *out);

#endif
