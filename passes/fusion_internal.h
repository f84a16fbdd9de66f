/* What the fusion pass's files share (passes/fusion.c builds the groups; passes/fusion_norm.c adds batch norm's). */
#ifndef DEFT_FUSION_INTERNAL_H
#define DEFT_FUSION_INTERNAL_H

#include <stdbool.h>

#include "program_state.h"

typedef struct deft_fusion {
    deft_program *p;
    int *pos;          /* per node: its step, or for a node that runs no kernel the first step reading it */
    int *cons_start;   /* consumers of node id: cons[cons_start[id] .. cons_start[id + 1]) */
    int *cons;
    int *group_of;     /* per node: index in p->groups, -1 */
    int cap_groups;
} deft_fusion;

/* f->pos from the program's steps as they stand (again after a pass moved some). */
void deft_fusion_positions(deft_fusion *f);
/* Whether node id runs a kernel of its own (needed, not a leaf, not a view). */
bool deft_is_step(const deft_fusion *f, int id);
/* A new empty group of `kind` at the end of p->groups (NULL when out of host memory); its members array holds
 * DEFT_FUSED_MAX_OPS. */
deft_group *deft_group_add(deft_fusion *f, deft_group_kind kind);
void deft_group_join(deft_fusion *f, int gi, int id);
/* Whether every reader of group gi's members outside it (`joining` counting as inside; -1 for none) comes after
 * step `at`. */
bool deft_readers_after(const deft_fusion *f, int gi, int joining, int at);

/* Whether s is the sum over k of op(b)[k, n] for matmul mm's b (a bias gradient its epilogue can compute). */
bool deft_is_bias_grad_of(const deft_tensor *s, const deft_tensor *mm);
/* The bias gradient of product m that no group holds yet (a step reading m's b, or the tensor b flattens), -1 if
 * none (CUDA builds only). */
int deft_find_bias_grad(const deft_fusion *f, int m);

/* Batches of products of one shape (passes/fusion_batch.c), formed first, from the products free then. */
deft_status deft_fuse_product_batches(deft_fusion *f);

/* Batch norm groups (passes/fusion_norm.c), formed before the elementwise chains so that these take what is left. */
deft_status deft_fuse_norm_epilogues(deft_fusion *f);

/* Batch norm's backward nodes with the ReLU gradient they read folded in (passes/fusion_norm_grad.c). */
deft_status deft_fuse_norm_grads(deft_fusion *f);

/* Layer norm with the residual add before it, and its dx with the add of the residual gradient after it
 * (passes/fusion_layer_norm.c). */
deft_status deft_fuse_layer_norms(deft_fusion *f);

/* Moves the steps in (e, r] of p that depend on step e's node (through views too) to right after step r, keeping
 * their order; *ok false (nothing moved) when step r is one of them or a step in (e, r] updates state. `tainted`:
 * scratch of one flag per node, all false on entry and on return. DEFT_ERR_OOM (nothing moved) when out of memory. */
deft_status deft_steps_defer_readers(deft_program *p, int e, int r, bool *tainted, bool *ok);

/* Cross-entropy's loss and gradient, and a recomputed activation and its gradient, as pairs that read their shared
 * operand once (passes/fusion_pairs.c); formed first, since forming one may move steps. */
deft_status deft_fuse_pairs(deft_fusion *f);

/* Groups of casts of parameters and constants (passes/fusion_casts.c). */
deft_status deft_fuse_leaf_casts(deft_fusion *f);

#endif
