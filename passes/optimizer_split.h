/* Optimizer in backward (the compile option optimizer_in_backward), a graph rewrite run by compile after
 * checkpointing and before scheduling.
 *
 * The step node of an optimizer reads every parameter's gradient, so all of them are alive at the end of the backward
 * pass. With one micro-batch per update, no clipping and no loss scaling, the update of a parameter needs nothing but
 * its own gradient and the step's counters. For one program the rewrite appends to the graph, per step node asked for:
 *  - pieces: one node per group of parameters that become ready together (consecutive in the flat storage, and no
 *    one's gradient waiting on another's last reader), reading their gradients, updating them in place and giving
 *    the sums of squares of their norm blocks (ir/optimizer.h);
 *  - a finisher, reading the pieces' sums in flat order: the norm, and the counters advanced once; the program reads
 *    the step node's value from it.
 * The schedule then moves each piece to just after the last step that produces one of its gradients or reads one of
 * its parameters (passes/optimizer_place.c), so each gradient's buffer dies there. Like checkpointing's copies the
 * nodes belong to the program (ckpt_owner, role DEFT_CKPT_OPTIMIZER_PART), no user node reads them, and they leave
 * the graph with the program when they are its last nodes.
 *
 * Data parallel with the compile option dist_bucket_pieces splits too: one piece per gradient bucket
 * (passes/grad_buckets.h; a bucket whose parameters are not consecutive in the flat storage gets one piece per run of
 * them), made in bucket order, and left by the schedule after the backward pass (passes/optimizer_place.c), where
 * each piece waits for its own bucket's all-reduce alone (dist/dist_program.c). There a step that cannot split
 * stays whole, without an error. */
#ifndef DEFT_OPTIMIZER_SPLIT_H
#define DEFT_OPTIMIZER_SPLIT_H

#include "compile_config.h"

typedef struct deft_opt_split {
    int n_before, n_after;   /* the graph's nodes before and after the rewrite */
    int *redirect;           /* n_after entries: for an output, the node the program computes it by, or -1 */
    int n_steps;             /* step nodes split */
    int n_pieces;            /* pieces made, over all of them */
    bool per_bucket;         /* data parallel: pieces per gradient bucket, run after the backward pass */
    int *bucket_of;          /* per_bucket: per node from n_before on, the bucket of a piece, or -1 */
} deft_opt_split;

/* Splits the optimizer steps among outputs (each read through redirect[id] when redirect, checkpointing's, has an
 * entry >= 0 for it): per gradient bucket with config->split_per_bucket, else one piece per group of parameters.
 * DEFT_ERR_INVALID with a message when a step cannot be split: it accumulates micro-batches or clips, the config
 * scales the loss (f16 autocast), a node the outputs need reads the step's value, or reads one of its parameters
 * after the step. *out is NULL when no output is a step. */
deft_status deft_optimizer_split(deft_graph *g, deft_tensor *const *outputs, int n_outputs, const int *redirect,
                                 const deft_config *config, const struct deft_program *owner, deft_opt_split **out);
/* Frees the record, and the nodes it made when g is given and they are still the graph's last nodes. */
void deft_opt_split_free(deft_graph *g, deft_opt_split *s);

#endif
