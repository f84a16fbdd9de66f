/* Test support for compiled programs and optimizers: the schedule, where each node lives, the optimizer split and the
 * gradient buckets, the optimizer's flat storage. */
#include "deft_testing.h"

#include <stdlib.h>

#include "compile_config.h"
#include "device_internal.h"
#include "fusion_internal.h"
#include "grad_buckets.h"
#include "optimizer.h"
#include "optimizer_split.h"
#include "program_graph.h"
#include "program_state.h"

_Static_assert(DEFT_TESTING_PLACE_NONE == DEFT_PLACE_NONE && DEFT_TESTING_PLACE_PERSISTENT == DEFT_PLACE_PERSISTENT &&
                   DEFT_TESTING_PLACE_ARENA == DEFT_PLACE_ARENA && DEFT_TESTING_PLACE_VIEW == DEFT_PLACE_VIEW &&
                   DEFT_TESTING_PLACE_FUSED == DEFT_PLACE_FUSED,
               "deft_testing.h's placements follow ir/graph_hooks.h");

deft_graph *deft_testing_program_graph(const deft_program *p) { return p ? p->graph : NULL; }

deft_tensor *deft_testing_step_node(const deft_program *p, int step) {
    return p && step >= 0 && step < p->n_steps ? p->graph->nodes[p->steps[step]] : NULL;
}

static const char *deft_testing_group_kind(deft_group_kind kind) {
    switch (kind) {
    case DEFT_GROUP_ELEMENTWISE: return "elementwise";
    case DEFT_GROUP_MATMUL: return "matmul";
    case DEFT_GROUP_NORM: return "norm";
    case DEFT_GROUP_CASTS: return "casts";
    case DEFT_GROUP_NORM_GRAD: return "norm_grad";
    case DEFT_GROUP_MATMUL_BATCH: return "matmul_batch";
    case DEFT_GROUP_LN_ADD: return "ln_add";
    case DEFT_GROUP_LN_GRAD_ADD: return "ln_grad_add";
    case DEFT_GROUP_LN_GRAD_SUMS: return "ln_grad_sums";
    case DEFT_GROUP_CE_PAIR: return "ce_pair";
    case DEFT_GROUP_ACT_PAIR: return "act_pair";
    }
    return "unknown";
}

void deft_testing_program_node_plan(const deft_program *p, const deft_tensor *t, deft_testing_node_plan *out) {
    deft_node_plan np;
    deft_program_node_plan(p, t, &np);
    *out = (deft_testing_node_plan){
        .place = (int)np.place, .step = np.step, .offset = np.offset, .size = np.size, .first = np.first,
        .last = np.last, .buffer = np.buffer, .is_output = np.is_output, .group = np.group,
        .group_kind = np.group >= 0 ? deft_testing_group_kind(p->groups[np.group].kind) : NULL,
        .dropped = np.dropped, .recompute = np.recompute, .side = np.side};
}

static void deft_testing_split_view(const deft_opt_split *sp, deft_testing_split *out) {
    *out = (deft_testing_split){.n_before = sp->n_before, .n_after = sp->n_after, .redirect = sp->redirect,
                                .n_steps = sp->n_steps, .n_pieces = sp->n_pieces, .per_bucket = sp->per_bucket,
                                .bucket_of = sp->bucket_of};
}

int deft_testing_program_split(const deft_program *p, deft_testing_split *out) {
    *out = (deft_testing_split){0};
    if (!p || !p->split) return 0;
    deft_testing_split_view(p->split, out);
    return 1;
}

deft_status deft_testing_optimizer_split(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                                         const deft_compile_options *opts, deft_testing_split *out, int *made) {
    deft_opt_split *sp = NULL;
    deft_config c;
    deft_status s = deft_config_resolve(opts, &c);
    if (s == DEFT_OK) s = deft_optimizer_split(g, outputs, n_outputs, NULL, &c, NULL, &sp);
    *out = (deft_testing_split){0};
    *made = sp != NULL;
    if (sp) deft_testing_split_view(sp, out);
    out->owned = sp;
    return s;
}

void deft_testing_split_free(deft_graph *g, deft_testing_split *s) {
    deft_opt_split_free(g, s->owned);
    *s = (deft_testing_split){0};
}

int deft_testing_split_per_bucket(const deft_compile_options *o) {
    deft_config c;
    return deft_config_resolve(o, &c) == DEFT_OK && c.split_per_bucket;
}

int deft_testing_optimizer_param_count(const deft_optimizer *o) { return o ? o->n_params : 0; }

deft_tensor *deft_testing_optimizer_param(const deft_optimizer *o, int i) {
    return o && i >= 0 && i < o->n_params ? o->params[i] : NULL;
}

deft_optimizer *deft_testing_step_optimizer(const deft_tensor *t) {
    return t && t->op == DEFT_OP_OPTIMIZER ? t->p.optimizer : NULL;
}

deft_optimizer *deft_testing_optimizer_part(const deft_optimizer *o, int *first_param, int *finisher) {
    const deft_optimizer_part *part = o ? o->part : NULL;
    if (first_param) *first_param = part ? part->first_param : -1;
    if (finisher) *finisher = part && part->finisher;
    return part ? part->whole : NULL;
}

int deft_testing_optimizer_gather_tables(const deft_optimizer *o) { return o ? o->n_gathers : 0; }

int deft_testing_optimizer_arrays(const deft_optimizer *o) { return o->kind == DEFT_OPTIM_ADAMW ? 3 : 2; }

size_t deft_testing_optimizer_array_bytes(const deft_optimizer *o) {
    return (size_t)o->total * deft_dtype_size(o->dtype);
}

/* Array `array`'s bytes: a sharded optimizer's state arrays hold its slice. */
static size_t deft_testing_array_bytes_of(const deft_optimizer *o, int array) {
    return array == 0 ? deft_testing_optimizer_array_bytes(o)
                      : (size_t)deft_optimizer_state_count(o) * deft_dtype_size(o->dtype);
}

void deft_testing_optimizer_zero(const deft_optimizer *o, deft_testing_zero *out) {
    *out = (deft_testing_zero){0};
    out->total = o->total;
    out->state_bytes = (size_t)(deft_testing_optimizer_arrays(o) - 1) * deft_testing_array_bytes_of(o, 1);
    out->planned_bytes = deft_optimizer_state_bytes(o);
    out->grad_bytes = o->flat_grads ? (size_t)deft_optimizer_grad_count(o) * deft_dtype_size(o->dtype) : 0;
    if (!deft_optimizer_sharded(o)) return;
    out->world = o->zero.world;
    out->rank = o->zero.rank;
    out->lo = o->zero.lo;
    out->hi = o->zero.hi;
    out->padded = o->zero.padded;
}

deft_status deft_testing_optimizer_read(const deft_optimizer *o, int array, void *host, size_t bytes) {
    const void *arrays[3] = {o->flat_params, o->state0, o->state1};
    if (array < 0 || array >= deft_testing_optimizer_arrays(o) || bytes != deft_testing_array_bytes_of(o, array))
        return deft_set_error(DEFT_ERR_INVALID, "optimizer_read: array %d of %zu bytes", array, bytes);
    const deft_status s = o->device.type == DEFT_CPU ? DEFT_OK : deft_device_synchronize(o->device);
    return s == DEFT_OK ? deft_mem_copy(deft_cpu(), host, o->device, arrays[array], bytes) : s;
}

deft_status deft_testing_grad_buckets(const deft_tensor *step, const deft_compile_options *o,
                                      deft_testing_buckets *out) {
    *out = (deft_testing_buckets){0};
    deft_grad_buckets *b = calloc(1, sizeof *b);
    if (!b) return deft_set_error(DEFT_ERR_OOM, "grad_buckets: out of host memory");
    deft_config c;
    deft_status s = deft_config_resolve(o, &c);
    if (s == DEFT_OK) s = deft_grad_buckets_cut(step, &c, b);
    if (s != DEFT_OK) {
        free(b);
        return s;
    }
    *out = (deft_testing_buckets){b->n, b->order, b->n_buckets, b->first, b->bytes, b};
    return DEFT_OK;
}

void deft_testing_grad_buckets_free(deft_testing_buckets *b) {
    if (b->owned) deft_grad_buckets_free(b->owned);
    free(b->owned);
    *b = (deft_testing_buckets){0};
}

/* The counters deft_testing.h declares for the side lane and product batches: read off the compiled program. */
int deft_program_side_steps(const deft_program *p) {
    int n = 0;
    for (int i = 0; p && i < p->n_steps; i++) n += p->nodes[p->steps[i]].side;
    return n;
}

int deft_program_batched_products(const deft_program *p) {
    int n = 0;
    for (int gi = 0; p && gi < p->n_groups; gi++) {
        const deft_group *g = &p->groups[gi];
        for (int m = 0; g->kind == DEFT_GROUP_MATMUL_BATCH && m < g->n_members; m++)
            n += p->graph->nodes[g->members[m]]->op == DEFT_OP_MATMUL;
    }
    return n;
}

size_t deft_testing_program_workspace(const deft_program *p, int device, int asked) {
    return p ? deft_program_gpu_workspace(p, device, asked) : 0;
}

deft_status deft_testing_defer_readers(deft_program *p, int early_step, int late_step, int *moved) {
    *moved = 0;
    if (!p || !p->steps || early_step < 0 || late_step <= early_step || late_step >= p->n_steps)
        return deft_set_error(DEFT_ERR_INVALID, "defer readers: steps %d and %d of a program of %d", early_step,
                              late_step, p && p->steps ? p->n_steps : 0);
    bool *tainted = calloc((size_t)p->n_nodes, sizeof *tainted);
    if (!tainted) return deft_set_error(DEFT_ERR_OOM, "defer readers: out of host memory");
    bool ok = false;
    const deft_status s = deft_steps_defer_readers(p, early_step, late_step, tainted, &ok);
    free(tainted);
    *moved = ok;
    return s;
}
