/* Activation checkpointing as a graph rewrite (passes/checkpoint*.c), run by compile after differentiation and
 * before scheduling and planning.
 *
 * The rewrite never changes a node the user built. For one program it appends to the graph:
 *  - recompute nodes: copies of the forward nodes whose saved values were dropped (and of the forward nodes between
 *    them and the nearest kept value), reading kept values, parameters and inputs;
 *  - backward copies: copies of the backward nodes that read a dropped value (directly or through other copies),
 *    reading the recompute nodes instead.
 * Each is created just before the first backward copy that reads it, so node ids stay a topological order and the
 * schedule, which runs steps in id order, runs each recomputation just before the backward steps that need it. The
 * program computes the copies instead of the user's backward nodes and reads an output from its copy. No user node
 * reads a copy, so other compiles of the graph never see them; they belong to the program that made them
 * (ckpt_owner) and leave the graph with it when they are the graph's last nodes. */
#ifndef DEFT_CHECKPOINT_H
#define DEFT_CHECKPOINT_H

#include "compile_config.h"

/* What the rest of the pipeline says about the graph as it stands: the program's bytes (arena + persistent), with
 * `redirect` (per original node, its copy's id or -1) naming where outputs now live. full: the planner's arena;
 * otherwise the lower bound (the most bytes live at one step), which is cheaper. *area: the sum over buffers of
 * bytes times steps live (how long memory is held, which tells apart choices of equal peak). */
typedef deft_status (*deft_ckpt_measure)(void *ctx, const int *redirect, int full, size_t *total, double *area);

typedef struct deft_ckpt_plan {
    int policy;              /* a deft_checkpoint_policy */
    int n_recast;            /* of the dropped values, autocast's casts of inputs (deft_ckpt_input_casts) */
    int n_cheap;             /* of the dropped values, those one pass makes again (deft_ckpt_cheap_recomputes) */
    int n_orig;              /* the graph's nodes before the rewrite; the program's copies follow */
    int n_total;             /* the graph's nodes after it */
    int *redirect;           /* per original node: the id of its backward copy, or -1 */
    bool *dropped;           /* per original node: its saved value is dropped and recomputed */
    int n_dropped;
    size_t dropped_bytes;
    int n_recompute;         /* recompute nodes that run a kernel */
    double recompute_flops, recompute_bytes;
    size_t total_without;    /* arena + persistent of the program without checkpointing */
} deft_ckpt_plan;

/* Chooses what to drop under c's policy, then appends the copies for owner. DEFT_ERR_OOM when the policy is
 * DEFT_CHECKPOINT_BUDGET and no choice meets c->memory_budget, with the smallest budget that can be met. */
deft_status deft_checkpoint_rewrite(deft_graph *g, deft_tensor *const *outputs, int n_outputs, const deft_config *c,
                                    const struct deft_program *owner, deft_ckpt_measure measure, void *ctx,
                                    deft_ckpt_plan **out);
/* Whether checkpointing could meet budget, for a program compiled without it: runs the budget search's greedy rounds
 * on the graph as it stands (leaving it so) and sets *smallest to the smallest total (arena + persistent) they
 * reached; it fits when *smallest <= budget. */
deft_status deft_checkpoint_probe(deft_graph *g, deft_tensor *const *outputs, int n_outputs, size_t budget,
                                  deft_ckpt_measure measure, void *ctx, size_t *smallest);
/* Frees the plan, and its copies when they are still the graph's last nodes. */
void deft_ckpt_plan_free(deft_graph *g, deft_ckpt_plan *plan);

/* ---- shared by the rewrite's files ---- */
typedef struct deft_ckpt_graph {
    deft_graph *g;
    int n;                   /* original nodes */
    bool *needed;            /* what the outputs need */
    bool *is_output;
    bool *forward;           /* an ancestor of a node with a gradient (the forward pass) */
    bool *read_late;         /* a forward value that a backward node reads (through views too) */
    bool *candidate;         /* read_late and may be dropped */
    int *cands, n_cands;     /* candidate ids, increasing */
} deft_ckpt_graph;

deft_status deft_ckpt_analyse(deft_graph *g, deft_tensor *const *outputs, int n_outputs, deft_ckpt_graph *a);
void deft_ckpt_graph_free(deft_ckpt_graph *a);

typedef struct deft_ckpt_applied {
    int *redirect;           /* per original node, as in deft_ckpt_plan */
    int n_recompute;
    double flops, bytes;     /* of the recompute nodes */
} deft_ckpt_applied;

/* Appends the copies for drop (per original node) and fills *out (redirect must hold a->n entries). */
deft_status deft_ckpt_apply(const deft_ckpt_graph *a, const bool *drop, const struct deft_program *owner,
                            deft_ckpt_applied *out);
/* Removes every node from id n on (copies made by a trial). */
void deft_ckpt_truncate(deft_graph *g, int n);

/* The drop sets of the fixed policies (passes/checkpoint_policy.c): each sets drop[id] for what it drops and leaves
 * the rest of drop as it was. */
void deft_ckpt_drop_marked(const deft_ckpt_graph *a, bool *drop);
void deft_ckpt_drop_segments(const deft_ckpt_graph *a, int segments, bool *drop);
/* Under autocast, every policy (DEFT_CHECKPOINT_NONE included) drops the casts the rewrite inserted of inputs
 * (through views and other such casts) that the backward pass reads: recasting the input where the backward pass reads it costs one
 * cast kernel, while keeping the cast holds a copy of the batch through the whole forward pass (an input itself
 * lives in persistent storage, not in the arena). Sets recast[id] for them and returns their number. */
int deft_ckpt_input_casts(const deft_ckpt_graph *a, bool *recast);
/* Unless the compile option no_cheap_recompute is set, every policy also drops the values that one pass over memory
 * makes again (an activation, a cast, a permute) from a forward value the backward pass reads anyway: GPT-2's GELU
 * output (its input is kept for the GELU's gradient) and an attention output's permute back to [B, T, H, D] (where
 * q, k and v are apart; deft_attention_packed writes that layout directly). Keeping
 * such a value holds a second copy of what is already held; recomputing it costs one memory-bound kernel where the
 * backward pass reads it (torch.compile's partitioner recomputes such ops likewise). Sets cheap[id] for them (not for
 * those already set) and returns their number. */
int deft_ckpt_cheap_recomputes(const deft_ckpt_graph *a, bool *cheap);

#endif
