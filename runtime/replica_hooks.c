/* The one registration of dist/'s replica hooks (runtime/replica_hooks.h). */
#include <stdatomic.h>

#include "replica_hooks.h"

static const deft_replica_hooks *_Atomic deft_replica_hooks_now;

void deft_replica_hooks_register(const deft_replica_hooks *hooks) { atomic_store(&deft_replica_hooks_now, hooks); }

const deft_replica_hooks *deft_replica_hooks_get(void) { return atomic_load(&deft_replica_hooks_now); }

deft_status deft_replica_attach(deft_program *p, const deft_config *c) {
    if (!c->dist) return DEFT_OK;
    const deft_replica_hooks *h = deft_replica_hooks_get();
    if (!h) return deft_set_error(DEFT_ERR_INVALID, "compile: the options name a dist that deft_dist_init did not make");
    return h->attach(p, c);
}

deft_status deft_replica_shard(deft_graph *g, const deft_config *c) {
    if (!c->dist || c->zero_stage != 1) return DEFT_OK;
    const deft_replica_hooks *h = deft_replica_hooks_get();
    if (!h) return deft_set_error(DEFT_ERR_INVALID, "compile: the options name a dist that deft_dist_init did not make");
    return h->shard(g, c);
}

void deft_replica_free(deft_program *p) {
    if (p->ddp) deft_replica_hooks_get()->free(p);
}
