/* Building optimizers: checking hyperparameters, collecting the parameters, and the step node. Their flat storage
 * and device state are the runtime's (runtime/optimizer_storage.c). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "graph_hooks.h"
#include "node.h"
#include "optimizer.h"

deft_adamw_options deft_adamw_defaults(void) { return (deft_adamw_options){1e-3, 0.9, 0.999, 1e-8, 1e-2}; }

static deft_status deft_check_sgd(const deft_sgd_options *o) {
    if (!o) return deft_set_error(DEFT_ERR_INVALID, "sgd: options are NULL (the learning rate has no default)");
    if (!deft_optimizer_lr_valid(o->lr)) return deft_set_error(DEFT_ERR_INVALID, "sgd: learning rate %g must be finite and >= 0", o->lr);
    if (!(o->momentum >= 0.0 && isfinite(o->momentum)) || !(o->weight_decay >= 0.0 && isfinite(o->weight_decay)) ||
        !(o->dampening >= 0.0 && o->dampening <= 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "sgd: momentum %g, dampening %g, weight_decay %g out of range",
                              o->momentum, o->dampening, o->weight_decay);
    if (o->nesterov && (o->momentum <= 0.0 || o->dampening != 0.0))
        return deft_set_error(DEFT_ERR_INVALID, "sgd: Nesterov momentum requires a momentum > 0 and zero dampening");
    return DEFT_OK;
}

static deft_status deft_check_adamw(const deft_adamw_options *o) {
    if (!deft_optimizer_lr_valid(o->lr))
        return deft_set_error(DEFT_ERR_INVALID, "adamw: learning rate %g must be finite and >= 0", o->lr);
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0) || !(o->beta2 >= 0.0 && o->beta2 < 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "adamw: betas (%g, %g) must lie in [0, 1)", o->beta1, o->beta2);
    if (!(o->eps >= 0.0 && isfinite(o->eps)) || !(o->weight_decay >= 0.0 && isfinite(o->weight_decay)))
        return deft_set_error(DEFT_ERR_INVALID, "adamw: eps %g and weight_decay %g must be finite and >= 0", o->eps,
                              o->weight_decay);
    return DEFT_OK;
}

static deft_status deft_check_step(const deft_step_options *s) {
    if (s && (s->accumulate_steps < 0 || !(s->max_grad_norm >= 0.0)))
        return deft_set_error(DEFT_ERR_INVALID, "optimizer: accumulate_steps %d and max_grad_norm %g must be >= 0",
                              s->accumulate_steps, s->max_grad_norm);
    return DEFT_OK;
}

/* Whether an optimizer built on g before updates t (whether or not its step node exists yet). */
static bool deft_param_owned(const deft_graph *g, const deft_tensor *t) {
    for (int i = 0; i < g->n_optimizers; i++)
        for (int k = 0; k < g->optimizers[i]->n_params; k++)
            if (g->optimizers[i]->params[k] == t) return true;
    return false;
}

/* The parameters with a gradient; they must agree on device and dtype, as the flat storage is one block. */
static deft_status deft_collect_params(deft_optimizer *opt) {
    deft_graph *g = opt->graph;
    opt->params = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *opt->params);
    opt->offsets = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *opt->offsets);
    if (!opt->params || !opt->offsets) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int id = 0; id < g->n_nodes; id++) {
        deft_tensor *t = g->nodes[id];
        if (t->op != DEFT_OP_PARAM || !t->grad || t->no_grad) continue;
        if (deft_param_owned(g, t))
            return deft_set_error(DEFT_ERR_STATE, "optimizer: %s is already updated by another optimizer", t->name);
        if (opt->n_params == 0) {
            opt->dtype = t->dtype;
            opt->device = t->device;
        }
        char d0[32], d1[32];
        if (!deft_device_equal(t->device, opt->device) || t->dtype != opt->dtype)
            return deft_set_error(DEFT_ERR_INVALID,
                                  "optimizer: parameters must share one device and dtype: %s is %s on %s, %s is %s on %s",
                                  opt->params[0]->name, deft_dtype_name(opt->dtype),
                                  deft_device_str(opt->device, d0, sizeof d0), t->name, deft_dtype_name(t->dtype),
                                  deft_device_str(t->device, d1, sizeof d1));
        opt->offsets[opt->n_params] = opt->total;
        opt->total += deft_shape_numel(t->ndim, t->shape);
        opt->params[opt->n_params++] = t;
    }
    if (opt->n_params == 0)
        return deft_set_error(DEFT_ERR_STATE, "optimizer: no parameter has a gradient; call deft_backward(loss) first");
    if (opt->dtype != DEFT_F32 && opt->dtype != DEFT_F64)
        return deft_set_error(DEFT_ERR_DTYPE, "optimizer: parameters are %s; the optimizer keeps f32 or f64 weights",
                              deft_dtype_name(opt->dtype));
    return DEFT_OK;
}

static deft_status deft_register(deft_optimizer *opt) {
    deft_graph *g = opt->graph;
    deft_optimizer **n = realloc(g->optimizers, (size_t)(g->n_optimizers + 1) * sizeof *n);
    if (!n) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    g->optimizers = n;
    g->optimizers[g->n_optimizers++] = opt;
    return DEFT_OK;
}

static deft_optimizer *deft_optimizer_new(deft_graph *g, deft_optimizer_kind kind, const deft_step_options *step) {
    deft_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt) {
        deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
        return NULL;
    }
    opt->graph = g;
    opt->kind = kind;
    opt->accumulate_steps = step && step->accumulate_steps > 0 ? step->accumulate_steps : 1;
    opt->max_grad_norm = step ? step->max_grad_norm : 0.0;
    opt->reference = deft_debug(DEFT_DEBUG_OPT_REFERENCE) != 0;
    opt->last_norm = NAN;
    opt->scaler.scale = 1.0f;
    deft_status s = deft_collect_params(opt);
    if (s == DEFT_OK) s = deft_register(opt);
    if (s != DEFT_OK) {
        deft_optimizer_destroy(opt);
        return NULL;
    }
    return opt;
}

static bool deft_check_graph(deft_graph *g, const char *what) {
    if (!g) {
        deft_set_error(DEFT_ERR_INVALID, "%s: graph is NULL", what);
        return false;
    }
    if (g->first_error != DEFT_OK) {
        deft_set_error(g->first_error, "%s: the graph has an error: %s", what, g->first_errmsg);
        return false;
    }
    return true;
}

deft_optimizer *deft_sgd(deft_graph *g, const deft_sgd_options *o, const deft_step_options *step) {
    if (!deft_check_graph(g, "sgd") || deft_check_sgd(o) != DEFT_OK || deft_check_step(step) != DEFT_OK) return NULL;
    deft_optimizer *opt = deft_optimizer_new(g, DEFT_OPTIM_SGD, step);
    if (opt) {
        opt->sgd = *o;
        opt->lr = o->lr;
    }
    return opt;
}

deft_optimizer *deft_adamw(deft_graph *g, const deft_adamw_options *o, const deft_step_options *step) {
    deft_adamw_options a = o ? *o : deft_adamw_defaults();
    if (!deft_check_graph(g, "adamw") || deft_check_adamw(&a) != DEFT_OK || deft_check_step(step) != DEFT_OK)
        return NULL;
    deft_optimizer *opt = deft_optimizer_new(g, DEFT_OPTIM_ADAMW, step);
    if (opt) {
        opt->adamw = a;
        opt->lr = a.lr;
    }
    return opt;
}

deft_tensor *deft_optimizer_step(deft_optimizer *opt) {
    if (!opt) {
        deft_set_error(DEFT_ERR_INVALID, "optimizer_step: optimizer is NULL");
        return NULL;
    }
    if (opt->step_node) return opt->step_node;
    deft_graph *g = opt->graph;
    deft_status s = deft_optimizer_blocks_init(opt);
    if (s != DEFT_OK) {
        deft_graph_fail(g, s, "optimizer_step: %s", deft_errmsg());
        return NULL;
    }
    deft_tensor **grads = malloc((size_t)opt->n_params * sizeof *grads);
    if (!grads) {
        deft_graph_fail(g, DEFT_ERR_OOM, "optimizer_step: out of host memory");
        return NULL;
    }
    for (int i = 0; i < opt->n_params; i++) grads[i] = opt->params[i]->grad;
    deft_tensor *t = deft_node_new(g, DEFT_OP_OPTIMIZER, DEFT_F32, opt->device, 0, NULL, opt->n_params, grads);
    free(grads);
    if (!t) return NULL;
    t->p.optimizer = opt;
    deft_set_name(t, opt->kind == DEFT_OPTIM_SGD ? "sgd.step" : "adamw.step");
    opt->step_node = t;
    return t;
}

deft_status deft_optimizer_check_grads(const deft_optimizer *opt, const char *step_name, deft_tensor *const *srcs,
                                       int n) {
    if (n != opt->n_params)
        return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: %d gradients for %d parameters", step_name, n,
                              opt->n_params);
    for (int i = 0; i < n; i++) {
        const deft_tensor *p = opt->params[i], *gr = srcs[i];
        if (deft_shape_numel(gr->ndim, gr->shape) != deft_shape_numel(p->ndim, p->shape))
            return deft_set_error(DEFT_ERR_INVALID, "optimizer %s: the gradient %s has %lld elements, the parameter "
                                  "%s %lld", step_name, gr->name, (long long)deft_shape_numel(gr->ndim, gr->shape),
                                  p->name, (long long)deft_shape_numel(p->ndim, p->shape));
        if (!deft_optimizer_grad_dtype_ok(opt->dtype, gr->dtype))
            return deft_set_error(DEFT_ERR_DTYPE, "optimizer %s: the gradient %s is %s for the %s parameter %s; it must "
                                  "be %s%s", step_name, gr->name, deft_dtype_name(gr->dtype),
                                  deft_dtype_name(opt->dtype), p->name, deft_dtype_name(opt->dtype),
                                  opt->dtype == DEFT_F32 ? " (or bf16 or f16, widened on load)" : "");
    }
    return DEFT_OK;
}

/* On a GPU only set_lr writes the device's rate, so the host's mirror is the truth. */
double deft_optimizer_lr(const deft_optimizer *opt) { return opt ? opt->lr : NAN; }

void *deft_optimizer_scale_storage(deft_optimizer *opt) {
    if (!opt->step_node) return NULL;
    return opt->dev ? (void *)&opt->dev->loss_scale : (void *)&opt->scaler.scale;
}

deft_optimizer *deft_optimizer_of_param(const deft_graph *g, const deft_tensor *t, int *index) {
    for (int i = 0; i < g->n_optimizers; i++) {
        deft_optimizer *o = g->optimizers[i];
        for (int k = 0; k < o->n_params; k++) {
            if (o->params[k] != t) continue;
            if (index) *index = k;
            return o;
        }
    }
    return NULL;
}

deft_tensor *deft_param_copy(deft_tensor *x, deft_dtype dt) {
    if (x->op != DEFT_OP_PARAM || x->dtype != DEFT_F32 || (dt != DEFT_BF16 && dt != DEFT_F16)) return NULL;
    const deft_optimizer *o = deft_optimizer_of_param(x->graph, x, NULL);
    if (!o || !o->step_node || o->dtype != DEFT_F32) return NULL;
    return deft_node_new(x->graph, DEFT_OP_PARAM_COPY, dt, x->device, x->ndim, x->shape, 1, &x);
}

void deft_optimizer_unbind_copies(deft_optimizer *opt) {
    deft_graph *g = opt->graph;
    for (int i = 0; opt->flat_low && i < g->n_nodes; i++) {
        deft_tensor *t = g->nodes[i];
        if (t->op != DEFT_OP_PARAM_COPY || !t->storage_borrowed || deft_optimizer_of_param(g, t->src[0], NULL) != opt)
            continue;
        t->host_data = t->dev_data = NULL;
        t->storage_borrowed = false;
    }
}

/* Seed nodes of autocast backward passes borrow the scale's storage: it goes with the optimizer. */
static void deft_release_scale_seeds(deft_optimizer *opt) {
    void *at = deft_optimizer_scale_storage(opt);
    deft_graph *g = opt->graph;
    for (int i = 0; at && i < g->n_nodes; i++) {
        deft_tensor *t = g->nodes[i];
        if (t->op != DEFT_OP_CONSTANT || !t->storage_borrowed) continue;
        if (t->host_data == at) t->host_data = NULL;
        if (t->dev_data == at) t->dev_data = NULL;
        t->storage_borrowed = false;
    }
}

/* Called by deft_graph_free before the nodes go: the parameters' storage lives in the flat block, which the runtime
 * gives back (once the device finished the steps that read it). */
void deft_optimizer_destroy(deft_optimizer *opt) {
    if (!opt) return;
    deft_release_scale_seeds(opt);
    deft_optimizer_unbind_copies(opt);   /* the copies' storage goes with the optimizer */
    for (int i = 0; opt->flat_params && i < opt->n_params; i++) {
        deft_tensor *t = opt->params[i];
        if (!t->storage_borrowed) continue;
        if (opt->device.type == DEFT_CPU) t->host_data = NULL;
        else t->dev_data = NULL;
        t->storage_borrowed = false;
    }
    if (opt->graph->hooks) opt->graph->hooks->optimizer_release(opt);
    deft_optimizer_parts_free(opt);
    free(opt->block_first);
    for (int i = 0; i < opt->n_gathers; i++) {
        free(opt->gathers[i].grads);
        free(opt->gathers[i].dtypes);
    }
    free(opt->params);
    free(opt->offsets);
    free(opt->groups);
    free(opt->group_of);
    free(opt);
}
