/* Compiling under autocast (graph/autocast.h): the outputs mapped to their counterparts in the rewrite, the user's
 * tensors aliased to them for reading; and, for every program, loss scaling switched on or off in the optimizers
 * whose steps it runs. The options were checked and resolved once (compile_config.c). */
#include <stdlib.h>

#include "autocast.h"
#include "optimizer.h"
#include "program_state.h"

deft_status deft_autocast_outputs(deft_graph *g, const deft_config *c, deft_tensor *const *outputs, int n,
                                  deft_tensor ***mapped) {
    *mapped = NULL;
    if (c->autocast == DEFT_F32) return DEFT_OK;
    deft_autocast *ac;
    /* The step reads bf16 gradients directly. f16 ones are widened first: f16 steps reading them directly differed
     * in the last bits (bench/RESULTS.md, "Fifth round") from tests/amp_ref.h's reference, whose network, compiled
     * with every gradient as an output, already differs before any update with no_fusion; until a reference that runs
     * the same kernels settles it, f16 keeps its casts. Data parallel averages f32 gradients, as PyTorch's DDP does. */
    deft_status s = deft_autocast_get(g, c->autocast, c->loss_scaled, c->dist != NULL || c->autocast != DEFT_BF16, &ac);
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

deft_status deft_autocast_configure_steps(deft_program *p) {
    /* A scaled step compiled by hand, outside the f16 policy, runs with GradScaler's defaults (the config's then). */
    deft_loss_scale_options ls = p->config.loss_scale;
    deft_status s = DEFT_OK;
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
