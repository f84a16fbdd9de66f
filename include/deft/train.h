/* Training (included by deft.h): gradients, optimizers and activation checkpointing. Mixed precision and loss
 * scaling are compile options (deft/compile.h). */
#ifndef DEFT_PUBLIC_TRAIN_H
#define DEFT_PUBLIC_TRAIN_H

#include "deft/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- training: gradients ----
 * Every parameter requires a gradient unless told otherwise. deft_backward(loss) adds to the graph the nodes that
 * compute d loss / d p for every parameter p the loss depends on; inputs and frozen parameters cost nothing. The
 * gradient of a parameter is an ordinary tensor of the graph: compile it as an output to read it. Calling backward
 * again (another loss) adds to the gradients, as in PyTorch. */
deft_status deft_param_set_requires_grad(deft_tensor *param, int requires_grad);
deft_status deft_backward(deft_tensor *loss);
/* The gradient of t (a parameter, or any tensor on the loss's path) after deft_backward; NULL (with a message) if
 * it has none. */
deft_tensor *deft_grad(const deft_tensor *t);

/* ---- optimizers: graph nodes that update the parameters in place ----
 * An optimizer keeps the parameters it updates, their gradients and its state in flat storage, and updates all of
 * them in one pass per step. Build it after deft_backward; compile its step node together with the loss. */
typedef struct deft_optimizer deft_optimizer;
typedef struct deft_sgd_options {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
} deft_sgd_options;
typedef struct deft_adamw_options {
    double lr, beta1, beta2, eps, weight_decay;
} deft_adamw_options;
/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
deft_adamw_options deft_adamw_defaults(void);
typedef struct deft_step_options {
    int accumulate_steps;    /* k >= 1 (0 means 1): the update runs every k-th run with the mean of the k runs'
                              * gradients, so k micro-batches of a mean loss step as one batch k times larger */
    double max_grad_norm;    /* > 0: clip the accumulated gradients to this global L2 norm before updating */
} deft_step_options;
/* Over every parameter of g that has a gradient (they must share one device and one dtype, f32 or f64). The SGD
 * options are required; NULL AdamW options mean deft_adamw_defaults(); step may be NULL. The hyperparameters follow
 * torch.optim.SGD and torch.optim.AdamW exactly; bad ones (a NaN or negative lr, nesterov without momentum) fail. */
deft_optimizer *deft_sgd(deft_graph *g, const deft_sgd_options *o, const deft_step_options *step);
deft_optimizer *deft_adamw(deft_graph *g, const deft_adamw_options *o, const deft_step_options *step);
/* The node that accumulates the gradients and applies the update every k-th run. Its value (one f32) is the global
 * gradient norm, before clipping, of the last update (under f16 loss scaling: of the unscaled gradients, and the inf
 * or NaN norm of a step it skipped). */
deft_tensor *deft_optimizer_step(deft_optimizer *opt);
/* Parameter groups, as torch.optim's param_groups: the n parameters get their own weight decay (AdamW's decoupled
 * decay p *= 1 - lr_g wd; SGD's wd p added to the gradient) and learning rate lr_g = lr * lr_scale (the optimizer's
 * rate, deft_optimizer_set_lr's included, times the scale: a schedule scales every group alike, as torch's
 * schedulers do). Parameters that no group names keep the optimizer's own weight decay and lr_scale 1, so AdamW with
 * weight decay and one group {0, 1} of the biases and norms is torch's AdamW over two groups. Momentum, betas, eps
 * and clipping stay the optimizer's (the gradient norm is over every parameter, as clip_grad_norm_ over the model).
 * Refused, changing nothing: a parameter the optimizer does not update (DEFT_ERR_INVALID), one already in a group or
 * named twice (DEFT_ERR_INVALID), a negative or non-finite value (DEFT_ERR_INVALID), and any call once a program
 * running the step was compiled (DEFT_ERR_STATE: the groups are fixed with the optimizer's storage; build them
 * between deft_adamw/deft_sgd and the first deft_compile). */
typedef struct deft_param_group_options {
    double weight_decay;     /* >= 0 */
    double lr_scale;         /* >= 0; 0 means 1 (a zeroed struct keeps the optimizer's rate) */
} deft_param_group_options;
deft_status deft_optimizer_param_group(deft_optimizer *opt, deft_tensor *const *params, int n,
                                       const deft_param_group_options *o);
/* nanoGPT's and llm.c's recipe: every parameter of fewer than two dims (biases, norm weights) that is in no group yet
 * goes into one group without weight decay; the others keep the optimizer's. Embedding tables are 2-D and keep their
 * decay, as there; give them a group of their own first to exclude them. */
deft_status deft_optimizer_decay_2d_only(deft_optimizer *opt);
/* The parameters an optimizer updates, in its order (the graph's build order). */
int deft_optimizer_param_count(const deft_optimizer *opt);
deft_tensor *deft_optimizer_param(const deft_optimizer *opt, int i);
/* Takes effect at the next update, without recompiling. NaN, infinite or negative: DEFT_ERR_INVALID. */
deft_status deft_optimizer_set_lr(deft_optimizer *opt, double lr);
double deft_optimizer_lr(const deft_optimizer *opt);
int64_t deft_optimizer_updates(const deft_optimizer *opt);   /* updates applied so far */
/* The dynamic loss scale of an optimizer stepped by an f16 autocast program (deft_loss_scale_options) and the updates
 * it skipped for inf/NaN gradients, read at any time (on a GPU, after the queued steps: a small device-to-host copy).
 * Before any such program was compiled the scale is 1 and nothing was skipped. Either pointer may be NULL. */
deft_status deft_optimizer_loss_scale(const deft_optimizer *opt, double *scale, int64_t *skipped);

/* Activation checkpointing: forward values the backward pass reads are dropped after the forward pass and
 * recomputed just before the backward steps that read them, giving the same bits (dropout recomputes its mask).
 * Compiling appends the recompute nodes, and copies of the backward nodes that read them, to the graph for that
 * program only: no node you built changes, other compiles never see them, and they go with the program (when they
 * are still the graph's last nodes; deft_graph_node_count counts them meanwhile). Outputs are read through your
 * tensors as ever; deft_program_schedules and deft_program_node_runs answer for what runs, so a backward node of
 * yours that a copy computes in its place reads as not scheduled. */
typedef enum deft_checkpoint_policy {
    DEFT_CHECKPOINT_NONE = 0,
    DEFT_CHECKPOINT_BUDGET,    /* the least recompute cost (FLOPs, bytes) whose plan fits memory_budget (arena +
                                * persistent); when none does, DEFT_ERR_OOM names the smallest budget that fits */
    DEFT_CHECKPOINT_MARKED,    /* drop what lies inside the spans given to deft_checkpoint_span */
    DEFT_CHECKPOINT_SEGMENTS   /* torch.utils.checkpoint.checkpoint_sequential: split the forward pass at layer
                                * boundaries into checkpoint_segments runs; keep only each run's last boundary,
                                * except in the last run, which keeps everything */
} deft_checkpoint_policy;
#define DEFT_HAS_CHECKPOINT 1
/* Marks the nodes on every path from `from` to `to` (both excluded) for DEFT_CHECKPOINT_MARKED, as
 * torch.utils.checkpoint.checkpoint(fn, from) returning `to`. */
deft_status deft_checkpoint_span(deft_tensor *from, deft_tensor *to);
typedef struct deft_checkpoint_report {
    int policy;                /* the deft_checkpoint_policy compiled with */
    int dropped;               /* forward values not kept for the backward pass */
    size_t dropped_bytes;      /* their bytes */
    int recomputed;            /* nodes run a second time in the backward pass */
    double recompute_flops;    /* their floating-point operations... */
    double recompute_bytes;    /* ...and the bytes they read and write */
    size_t arena_bytes;        /* the planned arenas with checkpointing */
    size_t peak_bytes;         /* arena + persistent: what memory_budget bounds */
    size_t peak_bytes_without; /* the same without checkpointing */
} deft_checkpoint_report;
/* What checkpointing did in p (zeros but for the arena and peak when nothing was dropped). Under autocast the casts
 * of inputs that the backward pass reads are always dropped and recast there (one cast kernel of the batch rather
 * than the cast held through the forward pass), whatever the policy, DEFT_CHECKPOINT_NONE included: they count
 * here as dropped and recomputed, and the budget search plans with them dropped. So do, unless the compile option
 * no_cheap_recompute is set, the values one pass over memory makes again from a value kept anyway (GELU's output,
 * a permute of the attention output). */
deft_status deft_program_checkpoint(const deft_program *p, deft_checkpoint_report *out);

#ifdef __cplusplus
}
#endif
#endif
