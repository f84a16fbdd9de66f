/* The compiled program: what the passes build (schedule, buffers, groups, lanes marked) and the runtime runs. */
#ifndef DEFT_PROGRAM_STATE_H
#define DEFT_PROGRAM_STATE_H

#include "compile_config.h"
#include "graph_hooks.h"
#include "graph_internal.h"
#include "planner.h"

struct deft_program_gpu;
struct deft_prefetch;

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
    int group;            /* index in groups of the fused group it belongs to, -1 if none */
    int redirect;         /* checkpointing: the id of the copy that computes this node instead, 0 if none */
    bool side;            /* a step's root: it runs on its GPU's side lane (passes/side_lane.h) */
} deft_node_state;

typedef struct deft_buffer {
    int node;             /* the base node owning it */
    int arena;
    int merged_into;      /* -1, or the buffer an in-place op took over (this one is then not planned) */
    deft_plan_buffer plan;
} deft_buffer;

/* Nodes that run as one kernel (passes/fusion.c). The group runs at its root's step; members other than the stores
 * never reach memory. */
typedef enum deft_group_kind {
    DEFT_GROUP_ELEMENTWISE,   /* a chain of same-shape f32, bf16 or f16 elementwise ops: ops/fused.h */
    DEFT_GROUP_MATMUL,        /* a matmul with a cuBLASLt epilogue: ops/cuda/cuda_matmul.h */
    DEFT_GROUP_NORM,          /* a batch norm and the add and ReLU after it: passes/fusion_norm.c */
    DEFT_GROUP_CASTS,         /* casts of parameters, run together at the first one's step: passes/fusion_casts.c */
    DEFT_GROUP_NORM_GRAD,     /* batch norm's backward reading a ReLU's gradient masked: passes/fusion_norm_grad.c */
    DEFT_GROUP_MATMUL_BATCH,  /* products of one shape (and their bias gradients) as one call: passes/fusion_batch.c */
    DEFT_GROUP_LN_ADD,        /* a residual add and the layer norm reading it: passes/fusion_layer_norm.c */
    DEFT_GROUP_LN_GRAD_ADD,   /* layer norm's dx and the add of the residual stream's gradient to it: the same */
    DEFT_GROUP_LN_GRAD_SUMS,  /* layer norm's dx (and that add) with its weight gradient, in one pass: the same */
    DEFT_GROUP_CE_PAIR,       /* cross-entropy's loss and its gradient in one pass: passes/fusion_pairs.c */
    DEFT_GROUP_ACT_PAIR       /* a recomputed activation and its gradient in one pass: passes/fusion_pairs.c */
} deft_group_kind;

typedef struct deft_group {
    deft_group_kind kind;
    int root;                 /* the member whose step runs the group (the last one in step order) */
    int n_members;
    int *members;             /* node ids, increasing */
    int n_inputs;
    int *inputs;              /* elementwise: node ids of the kernel's inputs, in register order */
    int n_stores;
    int *stores;              /* members written to memory (read outside the group, or outputs) */
    struct deft_fused_kernel *kernel;   /* elementwise */
    int matmul, bias;         /* matmul: the matmul node; the bias added by the epilogue (-1 if none) */
    int epilogue;             /* matmul: a deft_mm_epilogue_kind */
    int reduce;               /* elementwise: the full sum or mean ending the chain (the last store), -1 if none */
    int norm, residual;       /* norm: the batch norm node; the node its output is added to (-1 if none) */
    int relu;                 /* norm: 1 when a ReLU ends the group */
    int mask;                 /* norm_grad: the ReLU's gradient (DEFT_OP_ACT_GRAD) that is never stored */
    int add, cast;            /* ln_add: the add (its value is x) and the cast to f32 of one of its operands folded in
                               * (-1 if none); ln_grad_add: the add, and norm the dx node */
} deft_group;

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
    struct deft_program_gpu *gpu;   /* its streams and CUDA Graphs (runtime/program_graph.h); the runtime's, never
                                     * NULL in a compiled program */
    bool pinned_host;     /* its CPU arena and CPU inputs are page-locked (deft_pinned_alloc): it touches a GPU */
    int n_groups;
    deft_group *groups;   /* fused groups (none with the compile option no_fusion, or on the CPU) */
    unsigned cuda_flags;  /* DEFT_CUDA_* bits (cuda_kernels.h) from the compile options, passed to every kernel */
    deft_config config;   /* the compile options, resolved (compile_config.h): what the passes read */
    const char *stopped_after;   /* the stage its compile stopped after (stop_after), NULL: compiled whole; a
                                  * stopped program prints and dumps but never runs (passes/pipeline.h) */
    struct deft_prefetch *prefetch;   /* second input slots and their events, from the first feed_async (prefetch.c) */
    struct deft_ckpt_plan *ckpt;      /* what checkpointing dropped and the copies it made (passes/checkpoint.h) */
    struct deft_opt_split *split;     /* optimizer in backward: the pieces it made (passes/optimizer_split.h) */
    struct deft_ddp *ddp;             /* data parallel: the replica's gradient buckets (dist/dist_program.c) */
    int *alias;           /* autocast: per node id, the node whose value reading it gives (its counterpart for the
                           * outputs asked for, itself elsewhere); NULL without autocast (autocast_program.c) */
    /* The library scratch (cuBLAS, cuDNN, batch norm's) its streams hold on each GPU, noted by the runtime after every
     * run (runtime/program_graph.c): what the algorithms chosen for its steps asked for (mem/cuda_workspace.h).
     * Before the first run nothing is noted, and the reports count each scratch at its cap (passes/plan_report.c). */
    bool workspace_noted;
    int n_workspace;
    int workspace_device[DEFT_MAX_ARENAS];     /* CUDA device indices */
    size_t workspace_bytes[DEFT_MAX_ARENAS];
};

/* The node whose storage node id's value lives in (itself unless a view), and the byte offset in it (may be NULL). */
int deft_view_base(const deft_graph *g, int id, size_t *offset);

/* Reorders p->steps (compile option `reorder`) to lower the peak of live bytes; passes/program_reorder.c. */
deft_status deft_program_reorder(deft_program *p);

/* Groups p->steps into fused kernels where its GPUs allow (passes/fusion.c); members leave p->steps but for the
 * roots. Products of one shape run as one batch where p->config.product_batches allows. */
deft_status deft_program_fuse(deft_program *p);
void deft_program_groups_free(deft_program *p);

/* Compiling under autocast (passes/autocast_program.c). The outputs' counterparts in the rewrite (*mapped NULL
 * when c asks for no autocast); the user's outputs aliased to them once they are marked; loss scaling switched on
 * or off in the optimizers whose steps p runs (every program, from p->config). */
deft_status deft_autocast_outputs(deft_graph *g, const deft_config *c, deft_tensor *const *outputs, int n,
                                  deft_tensor ***mapped);
deft_status deft_autocast_alias(deft_program *p, deft_tensor *const *user, int n);

/* Where node t's value lives in p (the DOT dump's and the tests' view); passes/plan_report.c. */
void deft_program_node_plan(const deft_program *p, const deft_tensor *t, deft_node_plan *out);

#endif
