/* Compiling under autocast (graph/autocast.h): the options checked, the outputs mapped to their counterparts in the
 * rewrite, the user's tensors aliased to them for reading; and, for every program, loss scaling switched on or off
 * in the optimizers whose steps it runs. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "autocast.h"
#include "optimizer.h"
#include "program_state.h"

/* The loss-scale options with GradScaler's defaults filled in; DEFT_ERR_INVALID for one out of range. */
static deft_status deft_resolve_loss_scale(const deft_loss_scale_options *in, deft_loss_scale_options *out) {
    *out = *in;
    if (out->init_scale == 0.0) out->init_scale = 65536.0;
    if (out->growth_factor == 0.0) out->growth_factor = 2.0;
    if (out->backoff_factor == 0.0) out->backoff_factor = 0.5;
    if (out->growth_interval == 0) out->growth_interval = 2000;
    if (!(isfinite(out->init_scale) && out->init_scale > 0.0 && out->init_scale <= FLT_MAX))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.init_scale %g must be finite, > 0 and fit an f32",
                              in->init_scale);
    if (!(isfinite(out->growth_factor) && out->growth_factor > 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.growth_factor %g must be finite and > 1",
                              in->growth_factor);
    if (!(out->backoff_factor > 0.0 && out->backoff_factor < 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.backoff_factor %g must lie in (0, 1)",
                              in->backoff_factor);
    if (out->growth_interval < 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.growth_interval %d must be >= 1",
                              in->growth_interval);
    return DEFT_OK;
}

static bool deft_loss_scale_set(const deft_loss_scale_options *o) {
    return o->disable || o->init_scale != 0.0 || o->growth_factor != 0.0 || o->backoff_factor != 0.0 ||
           o->growth_interval != 0;
}

/* Whether the options ask for autocast, and with loss scaling; bad ones are DEFT_ERR_INVALID. */
static deft_status deft_autocast_policy(const deft_compile_options *o, bool *on, bool *scaled,
                                        deft_loss_scale_options *ls) {
    *on = *scaled = false;
    if (!o) return DEFT_OK;
    if (o->autocast != DEFT_F32 && o->autocast != DEFT_BF16 && o->autocast != DEFT_F16)
        return deft_set_error(DEFT_ERR_INVALID,
                              "compile: autocast must be bf16 or f16 (or 0, f32, for off), got %s",
                              (int)o->autocast >= 0 && o->autocast < DEFT_DTYPE_COUNT ? deft_dtype_name(o->autocast)
                                                                                      : "an unknown dtype");
    if (o->autocast != DEFT_F16 && deft_loss_scale_set(&o->loss_scale))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale options apply to f16 autocast only (autocast is "
                              "%s)", o->autocast == DEFT_F32 ? "off" : deft_dtype_name(o->autocast));
    *on = o->autocast != DEFT_F32;
    *scaled = o->autocast == DEFT_F16 && !o->loss_scale.disable;
    return *scaled ? deft_resolve_loss_scale(&o->loss_scale, ls) : DEFT_OK;
}

deft_status deft_autocast_outputs(deft_graph *g, const deft_compile_options *o, deft_tensor *const *outputs, int n,
                                  deft_tensor ***mapped) {
    *mapped = NULL;
    bool on, scaled;
    deft_loss_scale_options ls;
    deft_status s = deft_autocast_policy(o, &on, &scaled, &ls);
    if (s != DEFT_OK || !on) return s;
    deft_autocast *ac;
    /* The step reads bf16 gradients directly. f16 ones are widened first: on the H200, f16 steps reading them
     * directly differed in the last bits from tests/amp_ref.h's reference, whose network, compiled with every
     * gradient as an output, already differs before any update with no_fusion; until a reference that runs the same
     * kernels settles it, f16 keeps its casts. Data parallel averages f32 gradients, as PyTorch's DDP does. */
    s = deft_autocast_get(g, o->autocast, scaled, o->dist != NULL || o->autocast != DEFT_BF16, &ac);
    if (s != DEFT_OK) return s;
    deft_tensor **m = malloc((size_t)n * sizeof *m);
    if (!m) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_autocast_output(ac, outputs[i], &m[i]);
    if (s != DEFT_OK) {
        free(m);
        return s;
    }
    *mapped = m;
    return DEFT_OK;
}

deft_status deft_autocast_alias(deft_program *p, deft_tensor *const *user, int n) {
    p->alias = malloc((size_t)(p->n_nodes ? p->n_nodes : 1) * sizeof *p->alias);
    if (!p->alias) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    for (int id = 0; id < p->n_nodes; id++) p->alias[id] = id;
    for (int i = 0; i < n; i++) {
        p->alias[user[i]->id] = p->outputs[i];
        p->nodes[user[i]->id].is_output = true;
    }
    return DEFT_OK;
}

/* Another live program of the graph steps `opt` with the other kind of step (scaled or not). */
static const deft_tensor *deft_step_conflict(const deft_program *p, const deft_optimizer *opt, bool scaled) {
    const deft_graph *g = p->graph;
    for (int i = 0; i < g->n_programs; i++) {
        const deft_program *q = g->programs[i];
        if (q == p || !q->nodes) continue;
        for (int id = 0; id < q->n_nodes; id++) {
            const deft_tensor *t = g->nodes[id];
            if (q->nodes[id].needed && t->op == DEFT_OP_OPTIMIZER && t->p.optimizer == opt &&
                deft_autocast_step_scaled(g, t) != scaled)
                return t;
        }
    }
    return NULL;
}

deft_status deft_autocast_configure_steps(deft_program *p, const deft_compile_options *o) {
    bool on, scaled_policy;
    deft_loss_scale_options ls;
    deft_status s = deft_autocast_policy(o, &on, &scaled_policy, &ls);
    /* A scaled step compiled by hand, outside the f16 policy, runs with GradScaler's defaults. */
    if (s == DEFT_OK && !scaled_policy) s = deft_resolve_loss_scale(&(deft_loss_scale_options){0}, &ls);
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
        deft_optimizer *opt = t->p.optimizer;
        bool scaled = deft_autocast_step_scaled(p->graph, t);
        const deft_tensor *other = deft_step_conflict(p, opt, scaled);
        if (other)
            return deft_set_error(DEFT_ERR_STATE,
                                  "compile: %s steps its optimizer %s f16 loss scaling, and a live program steps it "
                                  "%s (%s); one optimizer cannot step both ways at once: free that program first",
                                  t->name, scaled ? "with" : "without", scaled ? "without" : "with", other->name);
        if (scaled) s = deft_optimizer_set_scaling(opt, &ls);
        else if (opt->scaler.on) s = deft_optimizer_set_scaling(opt, NULL);
    }
    return s;
}
