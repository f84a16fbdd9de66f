/* The compiled program's state, private to runtime/. */
#ifndef DEFT_PROGRAM_STATE_H
#define DEFT_PROGRAM_STATE_H

#include "graph_internal.h"
#include "planner.h"
#include "program_graph.h"
#include "program_internal.h"

#define DEFT_MAX_ARENAS 16   /* distinct devices one program may touch */

typedef struct deft_arena {
    deft_device device;
    size_t bytes;
    size_t lower_bound;
    size_t no_reuse_bytes;
    void *base;
} deft_arena;

/* Per node of the graph (indexed by node id; nodes added after compiling are not part of the program). */
typedef struct deft_node_state {
    bool needed;
    bool is_output;
    bool fed;             /* inputs: fed at least once */
    int step;             /* index in steps, -1 if it runs no kernel (leaf, view) or is not needed */
    int buffer;           /* index in buffers of its storage's base, -1 for persistent storage */
    int arena;            /* index in arenas of its buffer, -1 for persistent storage */
    size_t offset;        /* byte offset within its base storage (views) */
    void *input_storage;  /* inputs: the slot that feeds write */
    int64_t runs;
} deft_node_state;

typedef struct deft_buffer {
    int node;             /* the base node owning it */
    int arena;
    int merged_into;      /* -1, or the buffer an in-place op took over (this one is then not planned) */
    deft_plan_buffer plan;
} deft_buffer;

struct deft_program {
    deft_graph *graph;
    int n_nodes;
    deft_node_state *nodes;
    int n_steps;
    int *steps;           /* node ids in the order they run */
    int n_outputs;
    int *outputs;
    int n_buffers;
    deft_buffer *buffers;
    int n_arenas;
    deft_arena arenas[DEFT_MAX_ARENAS];
    size_t persistent_bytes;
    bool ran;
    uint64_t run_count;   /* runs started, the dropout masks' counter */
    deft_program_gpu gpu; /* its stream and CUDA Graph, when every step runs on one GPU */
    unsigned cuda_flags;  /* DEFT_CUDA_* bits (cuda_kernels.h) from the compile options, passed to every kernel */
};

/* deft_compile, returning its status. */
deft_status deft_compile_into(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                              const deft_compile_options *opts, deft_program **out);

/* The node whose storage node id's value lives in (itself unless a view), and the byte offset in it (may be NULL). */
int deft_view_base(const deft_graph *g, int id, size_t *offset);

/* Reorders p->steps (compile option `reorder`) to lower the peak of live bytes; runtime/program_reorder.c. */
deft_status deft_program_reorder(deft_program *p);

/* DEFT_ERR_INVALID / DEFT_ERR_STATE (with message) unless t is a node of p's graph as compiled; `what` names the
 * caller in the message. */
deft_status deft_check_program_tensor(const deft_program *p, const deft_tensor *t, const char *what);

/* The address of node id's value in a compiled program (persistent storage, arena, or a view into either). */
void *deft_program_data(const deft_program *p, int id);

#endif
