/* Optimizers' flat storage and device state (runtime/optimizer_storage.c). */
#ifndef DEFT_OPTIMIZER_STORAGE_H
#define DEFT_OPTIMIZER_STORAGE_H

#include "optimizer.h"

/* Gives every optimizer of g whose step node exists, and has none yet, its storage; called first by each compile, so
 * that the autocast rewrite's scale seeds and the plan see the flat block. A failure leaves the others as they were. */
deft_status deft_optimizers_materialize(deft_graph *g);
/* The graph hook: frees an optimizer's storage once the device finished the steps that read it. */
void deft_optimizer_release(deft_optimizer *opt);

/* Turns loss scaling on with these (checked) options, or off (o NULL). Turning it on the first time sets the scale
 * to o->init_scale; later it goes on from its current value. On a GPU this waits for the queued steps. */
deft_status deft_optimizer_set_scaling(struct deft_optimizer *opt, const deft_loss_scale_options *o);

/* ZeRO-1 (runtime/optimizer_zero.c): the slices of o's flat storage over `world` ranks, rank `rank`'s (padded to a
 * multiple of world * 16 bytes) in *z with no communicator (DEFT_ERR_INVALID when the padded size overflows); the
 * device's blocks of a sharded optimizer's slice (made with its storage) and their release; the sharding of the
 * graph's optimizers that got no storage taken back (a compile that failed before making it); DEFT_ERR_INVALID when
 * p steps a sharded optimizer without being a ZeRO-1 replica. */
deft_status deft_optimizer_zero_slices(const deft_optimizer *o, int world, int rank, deft_optimizer_zero *z);
deft_status deft_optimizer_zero_blocks_new(deft_optimizer *o);
void deft_optimizer_zero_release(deft_optimizer *o);
void deft_optimizers_unshard_unmade(deft_graph *g);
struct deft_program;
deft_status deft_program_check_sharding(const struct deft_program *p);
/* The first step node of opt (with parts, of a part of it too) that a live program of p's graph other than p needs and
 * for which keep(graph, node, ctx) holds (keep NULL: any); NULL when there is none. */
const deft_tensor *deft_optimizer_other_step(const struct deft_program *p, const deft_optimizer *opt, bool parts,
                                             bool (*keep)(const deft_graph *, const deft_tensor *, const void *),
                                             const void *ctx);

#endif
