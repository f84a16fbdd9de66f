/* The autocast rewrite (the compile option `autocast`, include/deft.h): how a graph as built becomes the same step
 * in mixed precision.
 *
 * How it works. The graph already holds the backward pass and the optimizer's node when it is compiled, so the
 * rewrite does not touch them: it appends to the graph, once per policy, a second step made of
 *   1. the forward pass re-built node by node under the policy (ir/autocast_policy.c), casts inserted where a
 *      node's policy wants another dtype than its input has (a layer norm that only products read is re-built with
 *      its value in the low dtype instead: ir/autocast_layer_norm.c); a node whose inputs and dtype do not change
 *      is not re-built but shared (leaves always are: inputs, f32 master weights, constants);
 *   2. the backward pass derived again from the re-built loss of each deft_backward call (ir/autodiff.c), started
 *      from the optimizer's loss scale under f16 with loss scaling, from 1 otherwise;
 *   3. for each optimizer step node, a twin reading the new gradients, updating the same flat storage. A weight's
 *      gradient is the cast back to f32 of the gradient of its cast to the low dtype: the twin reads that bf16/f16
 *      value itself and the optimizer widens it on load (exact, so the update is the same bit for bit), which saves
 *      the cast's kernel and half the optimizer's gradient reads. A rewrite for data parallel training keeps the f32
 *      gradients (f32_grads): the replicas average what the optimizer reads, as PyTorch's DDP averages f32 ones.
 * Every node of the graph as built then has a counterpart (itself when shared) or none (the inner nodes of the
 * original backward pass, which nothing replaces one for one): the program compiles the counterparts of the outputs
 * it is asked for, and reads through the user's tensors (runtime/program.c's alias). Every node a rewrite adds is
 * marked (deft_tensor.autocast), so that later rewrites skip them; a rewrite is kept with the graph and reused by
 * later compiles under the same policy while the user adds no node; the DOT dump draws the original nodes the
 * program does not compute beside the rewritten ones. */
#ifndef DEFT_AUTOCAST_H
#define DEFT_AUTOCAST_H

#include "graph_internal.h"

/* deft_tensor.autocast */
typedef enum deft_autocast_mark {
    DEFT_AUTOCAST_NONE = 0,   /* the user's own node */
    DEFT_AUTOCAST_CAST,       /* a cast the policy inserted */
    DEFT_AUTOCAST_NODE        /* a node of the rewritten step (re-built forward, new backward, the step's twin) */
} deft_autocast_mark;

typedef struct deft_autocast {
    deft_dtype dtype;         /* DEFT_BF16 or DEFT_F16 */
    int scaled;               /* the backward passes start from the loss scale of the graph's optimizer */
    int f32_grads;            /* the step twins read f32 gradients, never the low-precision ones (3. above) */
    int param_copies;         /* an optimized f32 parameter in the low dtype is its optimizer's persistent copy
                               * (DEFT_OP_PARAM_COPY, the compile option param_copies), not a cast */
    int n_user;               /* the graph's node count when the rewrite was made: what `map` covers */
    deft_tensor **map;        /* n_user counterparts (NULL: none) */
    deft_tensor **to_low, **to_f32;   /* casts made so far, by source node id (cap entries); a layer norm's to_low
                                       * may be the layer norm re-built in the low dtype (ir/autocast_layer_norm.c) */
    bool *ln_low;             /* by user node id (n_user): a layer norm that only low-precision products read */
    int cap;
    struct deft_autocast *next;
} deft_autocast;

/* The rewrite of g under (dtype, scaled, f32_grads, param_copies): the one kept from before when the user has added no
 * node since, else a new one (which leaves the nodes of earlier rewrites alone). */
deft_status deft_autocast_get(deft_graph *g, deft_dtype dtype, int scaled, int f32_grads, int param_copies,
                              deft_autocast **out);
/* The node a program under the rewrite computes for the user's tensor t, in t's dtype (a cast appended when the
 * counterpart has another); DEFT_ERR_INVALID naming t when it has none. */
deft_status deft_autocast_output(deft_autocast *ac, deft_tensor *t, deft_tensor **out);
void deft_autocast_free_all(deft_graph *g);
/* Whether `step` (an optimizer node) is the twin made by a rewrite with loss scaling: its program's backward passes
 * start from the scale, so its optimizer must unscale. */
bool deft_autocast_step_scaled(const deft_graph *g, const deft_tensor *step);

/* ---- ir/autocast_policy.c ---- */
/* x in dtype dt: x itself, or the one cast node made for (x, dt) (marked, named after x); under param_copies, for an
 * f32 parameter that an optimizer with a step updates, in the rewrite's low dtype, its copy (DEFT_OP_PARAM_COPY). */
deft_tensor *deft_autocast_cast(deft_autocast *ac, deft_tensor *x, deft_dtype dt);
/* t (a forward node of the user's graph) under the policy, given its inputs' counterparts src: t itself when nothing
 * changes, else a new node built by t's builder (marked). NULL with the graph's error on failure, or with
 * DEFT_ERR_INVALID (graph untouched) for an op the rewrite cannot re-build. */
deft_tensor *deft_autocast_node(deft_autocast *ac, deft_tensor *t, deft_tensor **src);

/* The memo slot of x's cast to dt (dt L or f32), NULL for another dtype or out of host memory (then with the error). */
deft_tensor **deft_autocast_memo(deft_autocast *ac, const deft_tensor *x, deft_dtype dt);
/* Whether reader r, a forward node of the user's graph, reads every float input cast to the low dtype (a product or
 * attention in f32: torch's lower-precision list). */
bool deft_autocast_reads_low(const deft_tensor *r);

/* ---- ir/autocast_layer_norm.c ---- */
/* Fills ac->ln_low: the user's f32 layer norms that some forward node reads and that every forward node reading them
 * (bwd: the nodes of the user's own backward pass, which the rewrite derives again) reads cast to the low dtype. Off
 * under the debug knob LN_WIDE. */
deft_status deft_autocast_find_ln_low(deft_autocast *ac, const deft_graph *g, const bool *bwd);
/* x (the counterpart of user node u) in the low dtype, for a reader that casts it: where u is marked in ln_low, the
 * layer norm re-built with its value in the low dtype (one per x, memoised as its cast), else deft_autocast_cast. */
deft_tensor *deft_autocast_low(deft_autocast *ac, const deft_tensor *u, deft_tensor *x);

/* ---- ir/autocast_image.c ---- */
/* Conv2d, pooling and batch norm's two nodes: re-built by deft_autocast_image. */
bool deft_autocast_is_image_op(deft_op op);
/* The dtype source k of batch norm node bn (its stats node or its normalising node) runs in. */
deft_dtype deft_batch_norm_input_dtype(const deft_autocast *ac, const deft_tensor *bn, int k);
/* Image op t re-built on src (the sources the policy gave it); on a device without its kernel in the low dtype, in
 * f32 on the sources widened, the result cast back to the low dtype. NULL with the graph's error on failure. */
deft_tensor *deft_autocast_image(deft_autocast *ac, const deft_tensor *t, deft_tensor **src);

#endif
