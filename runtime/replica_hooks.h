/* What a data-parallel replica adds to a program's compile and run. dist/ registers these hooks when a deft_dist is
 * made (before any program can name one), so that the runtime runs replicas without knowing NCCL or buckets; a
 * program without a dist never calls them. */
#ifndef DEFT_REPLICA_HOOKS_H
#define DEFT_REPLICA_HOOKS_H

#include "program_state.h"

typedef struct deft_replica_hooks {
    /* Compile: p->ddp from the config's dist (DEFT_OK and nothing when it names none). */
    deft_status (*attach)(struct deft_program *p, const deft_config *c);
    /* Compile, before the graph's optimizers get their storage, under zero_stage 1: shards them (ZeRO-1) across the
     * ranks of the config's dist (ir/optimizer.h's deft_optimizer_zero), or refuses one that cannot be. */
    deft_status (*shard)(deft_graph *g, const deft_config *c);
    void (*free)(struct deft_program *p);
    /* Before a run: whether the replica's communicator can still run one. */
    deft_status (*check_run)(const struct deft_program *p);
    /* Around a run and each of its steps: join buckets read at a step, all-reduce the ones complete after it. */
    deft_status (*begin_run)(struct deft_program *p);
    deft_status (*before_step)(struct deft_program *p, int step);
    deft_status (*after_step)(struct deft_program *p, int step);
    deft_status (*end_run)(struct deft_program *p);
    /* A host wait for the run's collectives that fails, rather than hangs, when a peer stopped. */
    deft_status (*wait)(struct deft_program *p);
} deft_replica_hooks;

void deft_replica_hooks_register(const deft_replica_hooks *hooks);
/* The registered hooks; NULL before any deft_dist was made. */
const deft_replica_hooks *deft_replica_hooks_get(void);
/* Compile: attaches the config's dist, if any, to p; a dist with no hooks registered is DEFT_ERR_INVALID. */
deft_status deft_replica_attach(deft_program *p, const deft_config *c);
/* Compile: the shard hook when the config asks for ZeRO-1 (nothing otherwise). */
deft_status deft_replica_shard(deft_graph *g, const deft_config *c);
/* Frees what attach made (its events and stream), if anything. */
void deft_replica_free(deft_program *p);

#endif
