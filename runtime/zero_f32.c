/* ZeRO-1 with the compile option param_copies: the step all-gathers the bf16 (f16) copies, which every matmul reads,
 * and broadcasts from their owners only the f32 values of the parameters the replica reads in f32 (ir/optimizer.h's
 * zero.f32_param). The rest of the f32 parameters are then current in their owner's slice only (f32_partial) until
 * deft_dist_gather_params, and whatever would read them, or write them and so refresh the copies from stale values,
 * is refused here rather than given another rank's old numbers. */
#include <stdlib.h>

#include "optimizer_storage.h"
#include "program_state.h"
#include "zero_f32.h"

/* o's index of parameter t, -1 when o does not update it. */
static int deft_param_index(const deft_optimizer *o, const deft_tensor *t) {
    for (int k = 0; t->op == DEFT_OP_PARAM && k < o->n_params; k++)
        if (o->params[k] == t) return k;
    return -1;
}

/* Marks in flags (o's n_params) the parameters of o that p reads in f32: a needed node reads one that is neither its
 * copy nor a step of an optimizer, or the parameter is an output itself. */
static void deft_zero_f32_reads(const deft_program *p, const deft_optimizer *o, bool *flags) {
    const deft_graph *g = p->graph;
    for (int k = 0; k < o->n_params; k++) flags[k] = p->nodes[o->params[k]->id].needed &&
                                                    p->nodes[o->params[k]->id].is_output;
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = g->nodes[id];
        if (!p->nodes[id].needed || t->op == DEFT_OP_PARAM_COPY || t->op == DEFT_OP_OPTIMIZER) continue;
        for (int j = 0; j < t->nsrc; j++) {
            const int i = deft_param_index(o, t->src[j]);
            if (i >= 0) flags[i] = true;
        }
    }
}

/* The pieces of the flagged parameters, cut at the slices: counted (out NULL) or written. */
static int64_t deft_zero_f32_cut(const deft_optimizer *o, const bool *flags, deft_zero_f32_piece *out) {
    int64_t n = 0;
    for (int i = 0; i < o->n_params; i++) {
        if (!flags[i]) continue;
        const int64_t off = o->offsets[i], count = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);
        int first, last;
        deft_optimizer_zero_ranks(o, off, count, &first, &last);
        for (int r = first; r <= last; r++, n++)
            if (out) {
                deft_optimizer_zero_piece(o, off, count, r, &out[n].lo, &out[n].hi);
                out[n].root = r;
            }
    }
    return n;
}

int64_t deft_zero_f32_plan(const deft_program *p, const deft_optimizer *o, bool *flags, deft_zero_f32_piece *pieces) {
    deft_zero_f32_reads(p, o, flags);
    return deft_zero_f32_cut(o, flags, pieces);
}

static deft_status deft_zero_f32_set(deft_optimizer *o, bool *flags) {
    const int64_t n = deft_zero_f32_cut(o, flags, NULL);
    if (n > 1 << 24)   /* one NCCL call each, in one group */
        return deft_set_error(DEFT_ERR_INVALID, "compile: %s: %lld pieces of f32 parameters to broadcast",
                              o->step_node->name, (long long)n);
    deft_zero_f32_piece *pieces = calloc((size_t)(n ? n : 1), sizeof *pieces);
    if (!pieces) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    deft_zero_f32_cut(o, flags, pieces);
    o->zero.f32_param = flags;
    o->zero.f32_pieces = pieces;
    o->zero.n_f32_pieces = (int)n;
    return DEFT_OK;
}

/* o's f32 set made from p's reads (taking flags, n_params of them), or p's reads checked against it. */
static deft_status deft_zero_f32_bind_one(const deft_program *p, deft_optimizer *o, bool *flags) {
    deft_zero_f32_reads(p, o, flags);
    if (!o->zero.f32_param) return deft_zero_f32_set(o, flags);
    for (int i = 0; i < o->n_params; i++) {
        if (!flags[i] || o->zero.f32_param[i]) continue;
        if (!p->config.param_copies)   /* the copies outlive their programs: the step gathers them */
            return deft_set_error(DEFT_ERR_STATE, "compile: this program steps %s, which keeps bf16 copies of its "
                                  "parameters since a program compiled with param_copies stepped it: its ZeRO-1 "
                                  "step gathers the copies and would leave %s, which this program reads in f32, "
                                  "partial; compile it with param_copies too", o->step_node->name, o->params[i]->name);
        return deft_set_error(DEFT_ERR_STATE, "compile: this program reads %s in f32 and steps %s, whose ZeRO-1 step "
                              "sends only the parameters that the first program compiled with param_copies read in "
                              "f32; build that program with this one's f32 reads", o->params[i]->name,
                              o->step_node->name);
    }
    return DEFT_OK;
}

deft_status deft_program_zero_f32_bind(const deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
        deft_optimizer *o = deft_optimizer_whole(t->p.optimizer);
        if (o->zero.world < 2 || !o->flat_low) continue;
        bool *flags = calloc((size_t)(o->n_params ? o->n_params : 1), sizeof *flags);
        if (!flags) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
        deft_status s = deft_zero_f32_bind_one(p, o, flags);
        if (o->zero.f32_param != flags) free(flags);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

void deft_optimizer_zero_f32_forget(deft_optimizer *o) {
    free(o->zero.f32_param);
    free(o->zero.f32_pieces);
    o->zero.f32_param = NULL;
    o->zero.f32_pieces = NULL;
    o->zero.n_f32_pieces = 0;
    o->f32_partial = false;
}

void deft_program_mark_f32_partial(const deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
        deft_optimizer *o = deft_optimizer_whole(t->p.optimizer);
        if (deft_optimizer_gathers_low(o)) o->f32_partial = true;
    }
}

static deft_status deft_partial_error(const char *what, const deft_tensor *param, const deft_optimizer *o) {
    return deft_set_error(DEFT_ERR_STATE, "%s: %s's f32 values are current on its ZeRO-1 owner only (%s gathers the "
                          "bf16 copies each step and sends only the parameters it reads in f32); call "
                          "deft_dist_gather_params on every rank first", what, param->name, o->step_node->name);
}

deft_status deft_program_check_f32_reads(const deft_program *p) {
    const deft_graph *g = p->graph;
    for (int k = 0; k < g->n_optimizers; k++) {
        const deft_optimizer *o = g->optimizers[k];
        if (!o->f32_partial) continue;
        bool *flags = calloc((size_t)(o->n_params ? o->n_params : 1), sizeof *flags);
        if (!flags) return deft_set_error(DEFT_ERR_OOM, "run: out of host memory");
        deft_zero_f32_reads(p, o, flags);
        int bad = -1;
        for (int i = 0; i < o->n_params && bad < 0; i++)
            if (flags[i] && !o->zero.f32_param[i]) bad = i;
        free(flags);
        if (bad >= 0) return deft_partial_error("run", o->params[bad], o);
    }
    return DEFT_OK;
}

deft_status deft_param_check_f32_current(const deft_tensor *param, bool any_param, const char *what) {
    int i = -1;
    const deft_optimizer *o = deft_optimizer_of_param(param->graph, param, &i);
    if (!o || !o->f32_partial) return DEFT_OK;
    if (!any_param && o->zero.f32_param[i]) return DEFT_OK;
    return deft_partial_error(what, param, o);
}

deft_status deft_graph_check_f32_current(const deft_graph *g, const char *what) {
    for (int k = 0; k < g->n_optimizers; k++) {
        const deft_optimizer *o = g->optimizers[k];
        if (o->f32_partial) return deft_partial_error(what, o->params[0], o);
    }
    return DEFT_OK;
}
