/* What the IR asks of the layers above it. A graph owns the programs compiled from it, the device copies of its
 * leaves and its optimizers' device storage, but the IR knows nothing of how programs are compiled or run or how
 * device memory is held: the runtime registers these hooks on a graph when it first compiles from it
 * (deft_graph_set_hooks), and before that the graph holds none of those things. */
#ifndef DEFT_GRAPH_HOOKS_H
#define DEFT_GRAPH_HOOKS_H

#include "graph_internal.h"

struct deft_optimizer;

/* Where a node's value lives in a compiled program (the DOT dump and plan reports show it). */
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
    int group;               /* the fused group computing it (passes/fusion.c), -1 if none */
    int dropped;             /* checkpointing: its saved value is dropped after the forward pass */
    int recompute;           /* checkpointing: it is a recomputation, in the backward pass, of a dropped value */
    int side;                /* its step runs on the GPU's side lane (passes/side_lane.h) */
} deft_node_plan;

typedef struct deft_graph_hooks {
    void (*program_free)(struct deft_program *p);
    /* Fills *out for node t; DEFT_PLACE_NONE if p does not compute t. */
    void (*node_plan)(const struct deft_program *p, const deft_tensor *t, deft_node_plan *out);
    /* Frees a parameter's or constant's device copy (t->dev_data). */
    void (*release_device_data)(deft_tensor *t);
    /* Frees an optimizer's flat storage, device state and tables, once its queued steps are done. */
    void (*optimizer_release)(struct deft_optimizer *opt);
} deft_graph_hooks;

/* Registers the runtime's hooks on g, before it gives g any program, device copy or optimizer storage; every compile
 * gives the same ones. */
void deft_graph_set_hooks(deft_graph *g, const deft_graph_hooks *hooks);
/* Registers p with g: freed with it. */
deft_status deft_graph_add_program(deft_graph *g, struct deft_program *p);
void deft_graph_remove_program(deft_graph *g, struct deft_program *p);
bool deft_graph_owns_program(const deft_graph *g, const struct deft_program *p);

#endif
