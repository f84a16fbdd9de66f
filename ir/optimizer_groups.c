/* Parameter groups of an optimizer, as torch.optim's param_groups: a weight decay and a learning-rate scale per
 * group. The parameters that no group names keep the optimizer's own options, so a model with one exception (no
 * decay on biases and norms) needs one group. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"

static int deft_param_index(const deft_optimizer *opt, const deft_tensor *t) {
    for (int i = 0; i < opt->n_params; i++)
        if (opt->params[i] == t) return i;
    return -1;
}

static deft_status deft_check_group_options(const deft_optimizer *opt, const deft_param_group_options *o) {
    if (!o) return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: options are NULL");
    if (!(o->weight_decay >= 0.0 && isfinite(o->weight_decay)) || !(o->lr_scale >= 0.0 && isfinite(o->lr_scale)))
        return deft_set_error(DEFT_ERR_INVALID,
                              "optimizer_param_group: weight_decay %g and lr_scale %g must be finite and >= 0",
                              o->weight_decay, o->lr_scale);
    if (opt->materialized)
        return deft_set_error(DEFT_ERR_STATE, "optimizer_param_group: %s was compiled already; its groups are fixed "
                              "then (set them before the first deft_compile of a program running the step)",
                              opt->step_node ? opt->step_node->name : "the optimizer");
    return DEFT_OK;
}

/* Every parameter's index into idx (n entries): each one the optimizer's, in no group yet, and named once. */
static deft_status deft_group_indices(const deft_optimizer *opt, deft_tensor *const *params, int n, int *idx) {
    for (int k = 0; k < n; k++) {
        if (!params[k]) return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: parameter %d is NULL", k);
        idx[k] = deft_param_index(opt, params[k]);
        if (idx[k] < 0)
            return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: %s is not a parameter this optimizer "
                                  "updates (a parameter without a gradient, frozen, another optimizer's, or not one)",
                                  params[k]->name);
        if (opt->group_of && opt->group_of[idx[k]] >= 0)
            return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: %s is already in group %d", params[k]->name,
                                  opt->group_of[idx[k]]);
        for (int j = 0; j < k; j++)
            if (idx[j] == idx[k])
                return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: %s is named twice", params[k]->name);
    }
    return DEFT_OK;
}

/* The per-parameter tables, each parameter starting with the optimizer's own options. */
static deft_status deft_groups_alloc(deft_optimizer *opt) {
    if (opt->groups) return DEFT_OK;
    deft_optimizer_group *g = malloc((size_t)opt->n_params * sizeof *g);
    int *of = malloc((size_t)opt->n_params * sizeof *of);
    if (!g || !of) {
        free(g);
        free(of);
        return deft_set_error(DEFT_ERR_OOM, "optimizer_param_group: out of host memory");
    }
    for (int i = 0; i < opt->n_params; i++) {
        g[i] = deft_optimizer_group_of(opt, i);
        of[i] = -1;
    }
    opt->groups = g;
    opt->group_of = of;
    return DEFT_OK;
}

deft_status deft_optimizer_param_group(deft_optimizer *opt, deft_tensor *const *params, int n,
                                       const deft_param_group_options *o) {
    if (!opt || opt->part) return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: optimizer is NULL");
    if (!params || n < 1)
        return deft_set_error(DEFT_ERR_INVALID, "optimizer_param_group: %d parameters; a group needs one or more", n);
    deft_status s = deft_check_group_options(opt, o);
    if (s != DEFT_OK) return s;
    int *idx = malloc((size_t)n * sizeof *idx);
    if (!idx) return deft_set_error(DEFT_ERR_OOM, "optimizer_param_group: out of host memory");
    s = deft_group_indices(opt, params, n, idx);
    if (s == DEFT_OK) s = deft_groups_alloc(opt);
    if (s == DEFT_OK) {
        const deft_optimizer_group grp = {o->weight_decay, o->lr_scale > 0.0 ? o->lr_scale : 1.0};
        for (int k = 0; k < n; k++) {
            opt->groups[idx[k]] = grp;
            opt->group_of[idx[k]] = opt->n_groups;
        }
        opt->n_groups++;
    }
    free(idx);
    return s;
}

deft_status deft_optimizer_decay_2d_only(deft_optimizer *opt) {
    if (!opt || opt->part) return deft_set_error(DEFT_ERR_INVALID, "optimizer_decay_2d_only: optimizer is NULL");
    const deft_param_group_options none = {.weight_decay = 0.0, .lr_scale = 1.0};
    deft_status s = deft_check_group_options(opt, &none);
    if (s != DEFT_OK) return s;
    deft_tensor **flat = malloc((size_t)(opt->n_params > 0 ? opt->n_params : 1) * sizeof *flat);
    if (!flat) return deft_set_error(DEFT_ERR_OOM, "optimizer_decay_2d_only: out of host memory");
    int n = 0;
    for (int i = 0; i < opt->n_params; i++)
        if (opt->params[i]->ndim < 2 && !(opt->group_of && opt->group_of[i] >= 0)) flat[n++] = opt->params[i];
    if (n > 0) s = deft_optimizer_param_group(opt, flat, n, &none);
    free(flat);
    return s;
}

int deft_optimizer_param_count(const deft_optimizer *opt) { return opt ? opt->n_params : 0; }

deft_tensor *deft_optimizer_param(const deft_optimizer *opt, int i) {
    if (!opt || i < 0 || i >= opt->n_params) {
        deft_set_error(DEFT_ERR_INVALID, "optimizer_param: index %d outside [0, %d)", i, opt ? opt->n_params : 0);
        return NULL;
    }
    return opt->params[i];
}
