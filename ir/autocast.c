/* The autocast rewrite's driver (ir/autocast.h says how it works): the forward pass re-built under the policy, the
 * backward pass derived again from each re-built loss, the optimizer's step re-pointed at the new gradients, and the
 * map from the user's nodes to their counterparts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocast.h"
#include "autodiff.h"
#include "node.h"
#include "optimizer.h"

static void deft_autocast_free(deft_autocast *ac) {
    if (!ac) return;
    free(ac->map);
    free(ac->to_low);
    free(ac->to_f32);
    free(ac->ln_low);
    free(ac);
}

void deft_autocast_free_all(deft_graph *g) {
    while (g->autocasts) {
        deft_autocast *next = g->autocasts->next;
        deft_autocast_free(g->autocasts);
        g->autocasts = next;
    }
}

/* Nodes a deft_backward call added: the rewrite derives its own backward pass instead. */
static bool *deft_backward_nodes(const deft_graph *g, int n) {
    bool *bwd = calloc((size_t)(n ? n : 1), sizeof *bwd);
    for (int c = 0; bwd && c < g->n_backward_calls; c++)
        for (int id = g->backward_calls[c].first; id < g->backward_calls[c].end && id < n; id++) bwd[id] = true;
    return bwd;
}

static deft_status deft_rewrite_failed(deft_graph *g, const char *what) {
    deft_status s = g->first_error != DEFT_OK ? g->first_error : DEFT_ERR_INVALID;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", g->first_error != DEFT_OK ? g->first_errmsg : deft_errmsg());
    return deft_set_error(s, "autocast: %s: %s", what, msg);
}

/* Step 1: each forward node under the policy, in id order (inputs before their readers). */
static deft_status deft_rewrite_forward(deft_autocast *ac, deft_graph *g, const bool *bwd) {
    deft_tensor *small[8];
    for (int id = 0; id < ac->n_user; id++) {
        deft_tensor *t = g->nodes[id];
        if (bwd[id] || t->op == DEFT_OP_OPTIMIZER || t->autocast != DEFT_AUTOCAST_NONE) continue;
        deft_tensor **src = t->nsrc <= 8 ? small : malloc((size_t)t->nsrc * sizeof *src);
        if (!src) return deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
        bool mapped = true;
        for (int k = 0; k < t->nsrc; k++) mapped &= (src[k] = ac->map[t->src[k]->id]) != NULL;
        /* A node reading the original backward pass (a gradient) has no counterpart: nothing it needs is re-built. */
        if (mapped) ac->map[id] = deft_autocast_node(ac, t, src);
        if (src != small) free(src);
        if (mapped && !ac->map[id]) return deft_rewrite_failed(g, t->name);
    }
    return DEFT_OK;
}

/* The optimizer whose loss scale the backward passes start from: the graph's one optimizer with a step node. */
static deft_status deft_scaled_optimizer(deft_graph *g, deft_optimizer **out) {
    *out = NULL;
    for (int i = 0; i < g->n_optimizers; i++) {
        if (!g->optimizers[i]->step_node) continue;
        if (*out)
            return deft_set_error(DEFT_ERR_INVALID,
                                  "autocast: f16 loss scaling needs one optimizer per graph, and this one has two "
                                  "(%s and %s); set loss_scale.disable or step them in separate graphs",
                                  (*out)->step_node->name, g->optimizers[i]->step_node->name);
        *out = g->optimizers[i];
    }
    return DEFT_OK;
}

/* The backward pass's first gradient under loss scaling: a constant whose storage is the optimizer's current scale,
 * so that each step reads the scale the previous one left, on the device. */
static deft_tensor *deft_scale_seed(deft_optimizer *opt, deft_tensor *loss) {
    deft_graph *g = loss->graph;
    if (!deft_device_equal(loss->device, opt->device)) {
        char a[32], b[32];
        deft_set_error(DEFT_ERR_DEVICE, "autocast: the loss %s is on %s and the optimizer's parameters on %s; loss "
                       "scaling needs both on one device", loss->name, deft_device_str(loss->device, a, sizeof a),
                       deft_device_str(opt->device, b, sizeof b));
        return NULL;
    }
    deft_tensor *seed = deft_node_new(g, DEFT_OP_CONSTANT, DEFT_F32, loss->device, loss->ndim, loss->shape, 0, NULL);
    if (!seed) return NULL;
    deft_set_name(seed, "loss_scale");
    void *at = deft_optimizer_scale_storage(opt);
    if (loss->device.type == DEFT_CPU) seed->host_data = at;
    else seed->dev_data = at;
    seed->storage_borrowed = true;
    seed->autocast = DEFT_AUTOCAST_NODE;
    return loss->dtype == DEFT_F32 ? seed : deft_cast(seed, loss->dtype);
}

/* Step 2: the backward pass of each re-built loss, the gradients of several calls summed as deft_backward sums them.
 * grads gets the sums by node id (n entries). */
static deft_status deft_rewrite_backward(deft_autocast *ac, deft_graph *g, deft_optimizer *scaled, deft_tensor **grads,
                                         int n) {
    for (int c = 0; c < g->n_backward_calls; c++) {
        const deft_tensor *user_loss = g->backward_calls[c].loss;
        deft_tensor *loss = ac->map[user_loss->id];
        if (!loss) return deft_set_error(DEFT_ERR_INVALID, "autocast: the loss %s has no counterpart", user_loss->name);
        deft_tensor *seed = NULL;
        if (scaled && !(seed = deft_scale_seed(scaled, loss))) return deft_rewrite_failed(g, "the loss scale");
        deft_tensor **got;
        deft_status s = deft_backward_collect(loss, seed, &got);
        if (s != DEFT_OK) return deft_rewrite_failed(g, user_loss->name);
        for (int id = 0; id <= loss->id && id < n; id++)
            if (got[id]) grads[id] = grads[id] ? deft_add(grads[id], got[id]) : got[id];
        free(got);
        if (g->first_error != DEFT_OK) return deft_rewrite_failed(g, user_loss->name);
    }
    return DEFT_OK;
}

/* Step 3: the user's gradient of u (published by deft_backward) maps to the new gradient of u's counterpart. */
static deft_status deft_map_grads(deft_autocast *ac, deft_graph *g, const bool *bwd, deft_tensor **grads, int n) {
    for (int id = 0; id < ac->n_user; id++) {
        deft_tensor *u = g->nodes[id], *m = ac->map[id];
        if (bwd[id] || !m || u->autocast != DEFT_AUTOCAST_NONE || !u->grad || u->grad->id >= ac->n_user || m->id >= n || !grads[m->id]) continue;
        deft_tensor *gr = deft_autocast_cast(ac, grads[m->id], u->grad->dtype);
        if (!gr) return deft_rewrite_failed(g, u->grad->name);
        if (gr->id >= ac->n_user && gr->autocast == DEFT_AUTOCAST_NONE) {
            char name[64];
            snprintf(name, sizeof name, "%.52s@%s", u->grad->name, deft_dtype_name(ac->dtype));
            deft_set_name(gr, name);
        }
        ac->map[u->grad->id] = gr;
    }
    return DEFT_OK;
}

/* What the twin of a step reads for the gradient gr (f32, the weight's dtype, from step 3): a weight used through a
 * cast to the low dtype has as gradient the cast back to f32 of a bf16/f16 value; the optimizer reads that value
 * itself and widens it on load (exact), so the cast has no reader and is not computed. Kept f32 for a rewrite whose
 * gradients must stay f32 (data parallel averages them: ir/autocast.h). */
static deft_tensor *deft_step_grad(const deft_autocast *ac, const deft_optimizer *opt, deft_tensor *gr) {
    if (ac->f32_grads || gr->id < ac->n_user || gr->op != DEFT_OP_CAST || gr->dtype != DEFT_F32) return gr;
    deft_tensor *low = gr->src[0];
    return low->dtype == ac->dtype && deft_optimizer_grad_dtype_ok(opt->dtype, low->dtype) ? low : gr;
}

/* Step 4: a twin of each optimizer step node reading the new gradients; it updates the same flat storage. */
static deft_status deft_rewrite_steps(deft_autocast *ac, deft_graph *g) {
    for (int id = 0; id < ac->n_user; id++) {
        deft_tensor *t = g->nodes[id];
        if (t->op != DEFT_OP_OPTIMIZER || t->autocast != DEFT_AUTOCAST_NONE) continue;   /* twins of other rewrites */
        deft_tensor **src = malloc((size_t)(t->nsrc ? t->nsrc : 1) * sizeof *src);
        if (!src) return deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
        bool mapped = true;
        for (int k = 0; k < t->nsrc; k++) mapped &= (src[k] = ac->map[t->src[k]->id]) != NULL;
        for (int k = 0; mapped && k < t->nsrc; k++) src[k] = deft_step_grad(ac, t->p.optimizer, src[k]);
        deft_status s = mapped ? deft_optimizer_check_grads(t->p.optimizer, t->name, src, t->nsrc) : DEFT_OK;
        deft_tensor *twin = mapped && s == DEFT_OK ? deft_node_new(g, DEFT_OP_OPTIMIZER, t->dtype, t->device, t->ndim,
                                                                   t->shape, t->nsrc, src)
                                                   : NULL;
        free(src);
        if (s != DEFT_OK) return s;
        if (!mapped) continue;
        if (!twin) return deft_rewrite_failed(g, t->name);
        twin->p.optimizer = t->p.optimizer;
        char name[64];
        snprintf(name, sizeof name, "%.52s@%s", t->name, deft_dtype_name(ac->dtype));
        deft_set_name(twin, name);
        ac->map[id] = twin;
    }
    return DEFT_OK;
}

/* Everything the rewrite added is marked: casts (forward, and those the backward pass makes of them) drawn as such. */
static void deft_mark_added(deft_graph *g, int from) {
    for (int id = from; id < g->n_nodes; id++) {
        deft_tensor *t = g->nodes[id];
        if (t->op == DEFT_OP_CAST) t->autocast = DEFT_AUTOCAST_CAST;
        else if (t->autocast == DEFT_AUTOCAST_NONE) t->autocast = DEFT_AUTOCAST_NODE;
    }
}

static deft_status deft_autocast_build(deft_autocast *ac, deft_graph *g) {
    deft_optimizer *scaled = NULL;
    deft_status s = ac->scaled ? deft_scaled_optimizer(g, &scaled) : DEFT_OK;
    bool *bwd = s == DEFT_OK ? deft_backward_nodes(g, ac->n_user) : NULL;
    ac->map = calloc((size_t)(ac->n_user ? ac->n_user : 1), sizeof *ac->map);
    if (s == DEFT_OK && (!bwd || !ac->map)) s = deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
    if (s == DEFT_OK) s = deft_autocast_find_ln_low(ac, g, bwd);
    if (s == DEFT_OK) s = deft_rewrite_forward(ac, g, bwd);
    int n = g->n_nodes;
    deft_tensor **grads = s == DEFT_OK ? calloc((size_t)(n ? n : 1), sizeof *grads) : NULL;
    if (s == DEFT_OK && !grads) s = deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
    if (s == DEFT_OK) s = deft_rewrite_backward(ac, g, scaled, grads, n);
    if (s == DEFT_OK) s = deft_map_grads(ac, g, bwd, grads, n);
    if (s == DEFT_OK) s = deft_rewrite_steps(ac, g);
    deft_mark_added(g, ac->n_user);
    free(grads);
    free(bwd);
    return s;
}

/* A rewrite still holds while every node added after it was made by a rewrite (this one or another policy's) or by
 * a program for itself (checkpoint copies, optimizer pieces, which no user node reads): the user has built nothing
 * since, neither forward nodes nor another backward pass. */
static bool deft_autocast_current(const deft_autocast *ac, const deft_graph *g) {
    for (int id = ac->n_user; id < g->n_nodes; id++)
        if (g->nodes[id]->autocast == DEFT_AUTOCAST_NONE && g->nodes[id]->ckpt_role == DEFT_CKPT_USER) return false;
    return true;
}

deft_status deft_autocast_get(deft_graph *g, deft_dtype dtype, int scaled, int f32_grads, int param_copies,
                              deft_autocast **out) {
    *out = NULL;
    for (deft_autocast *ac = g->autocasts; ac; ac = ac->next) {
        if (ac->dtype == dtype && ac->scaled == scaled && ac->f32_grads == f32_grads &&
            ac->param_copies == param_copies && deft_autocast_current(ac, g)) {
            *out = ac;
            return DEFT_OK;
        }
    }
    deft_autocast *ac = calloc(1, sizeof *ac);
    if (!ac) return deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
    ac->dtype = dtype;
    ac->scaled = scaled;
    ac->f32_grads = f32_grads;
    ac->param_copies = param_copies;
    ac->n_user = g->n_nodes;
    deft_status s = deft_autocast_build(ac, g);
    if (s != DEFT_OK) {
        deft_autocast_free(ac);
        return s;
    }
    ac->next = g->autocasts;
    g->autocasts = ac;
    *out = ac;
    return DEFT_OK;
}

deft_status deft_autocast_output(deft_autocast *ac, deft_tensor *t, deft_tensor **out) {
    *out = t;
    if (t->autocast != DEFT_AUTOCAST_NONE) return DEFT_OK;   /* a node some rewrite made: compiled as it is */
    deft_tensor *m = ac->map[t->id];
    if (!m)
        return deft_set_error(DEFT_ERR_INVALID,
                              "compile: %s lies inside the backward pass as built, which autocast %s derives again "
                              "and has no counterpart for it; ask for the loss, the optimizer's step, a forward "
                              "tensor or deft_grad() of one",
                              t->name, deft_dtype_name(ac->dtype));
    deft_graph *g = t->graph;
    m = deft_autocast_cast(ac, m, t->dtype);
    if (!m) return deft_rewrite_failed(g, t->name);
    deft_mark_added(g, ac->n_user);
    *out = m;
    return DEFT_OK;
}

bool deft_autocast_step_scaled(const deft_graph *g, const deft_tensor *step) {
    while (step->ckpt_origin) step = step->ckpt_origin;   /* a program's copy of a twin steps as the twin does */
    if (step->autocast == DEFT_AUTOCAST_NONE) return false;
    for (const deft_autocast *ac = g->autocasts; ac; ac = ac->next) {
        if (!ac->scaled) continue;
        for (int id = 0; id < ac->n_user; id++)
            if (ac->map[id] == step && g->nodes[id]->op == DEFT_OP_OPTIMIZER) return true;
    }
    return false;
}
