/* A small network with 2-D weights, biases and a norm-like 1-D scale, trained by AdamW or SGD with parameter groups
 * (deft_optimizer_param_group), for test_param_groups.c (against a plain reference loop) and
 * cuda_test_param_groups.c (the GPU against the CPU). Include after check.h and ref.h. */
#ifndef DEFT_TEST_PARAM_GROUPS_NET_H
#define DEFT_TEST_PARAM_GROUPS_NET_H

#define PG_PARAMS 5

typedef struct pg_spec {
    int adamw;                 /* 1: AdamW, 0: SGD with momentum */
    int groups;                /* 0: none; 1: biases and the scale in a group {wd_small, lr_scale}; 2: decay_2d_only */
    double lr, wd, group_wd, group_lr_scale;
    int64_t in, hidden, out, batch;
    deft_step_options step;    /* accumulate_steps, max_grad_norm */
    deft_compile_options copts;
} pg_spec;

typedef struct pg_net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_tensor *params[PG_PARAMS];   /* w1 [in, hidden], b1 [hidden], w2 [hidden, out], b2 [out], scale [out] */
    deft_optimizer *opt;
    deft_program *prog;
    float *xv, *yv;
} pg_net;

/* Builds the network on dev with values from `seed` (the same on every device), the optimizer and its groups, and
 * compiles the loss, the step and every gradient. 0 on a failure (checked). */
static int pg_build(pg_net *n, const pg_spec *s, deft_device dev, uint64_t seed) {
    memset(n, 0, sizeof *n);
    n->g = deft_graph_new();
    const int64_t xs[2] = {s->batch, s->in}, ys[2] = {s->batch, s->out};
    const int64_t shapes[PG_PARAMS][2] = {{s->in, s->hidden}, {s->hidden, 0}, {s->hidden, s->out}, {s->out, 0},
                                          {s->out, 0}};
    static const char *const names[PG_PARAMS] = {"w1", "b1", "w2", "b2", "scale"};
    for (int i = 0; i < PG_PARAMS; i++) {
        const int nd = shapes[i][1] ? 2 : 1;
        n->params[i] = deft_param(n->g, names[i], DEFT_F32, nd, shapes[i], dev, DEFT_INIT_ZEROS);
        const int64_t cnt = deft_tensor_numel(n->params[i]);
        float *v = malloc((size_t)cnt * sizeof *v);
        for (int64_t j = 0; j < cnt; j++)
            v[j] = (float)(i == 4 ? ref_unif(&seed, 0.5, 1.5) : ref_unif(&seed, -0.5, 0.5));
        CHECK_OK(deft_param_set(n->params[i], v, (size_t)cnt * sizeof *v));
        free(v);
    }
    n->x = deft_input(n->g, "x", DEFT_F32, 2, xs, dev);
    n->y = deft_input(n->g, "y", DEFT_F32, 2, ys, dev);
    n->xv = malloc((size_t)(s->batch * s->in) * sizeof(float));
    n->yv = malloc((size_t)(s->batch * s->out) * sizeof(float));
    for (int64_t j = 0; j < s->batch * s->in; j++) n->xv[j] = (float)ref_unif(&seed, -1, 1);
    for (int64_t j = 0; j < s->batch * s->out; j++) n->yv[j] = (float)ref_unif(&seed, -1, 1);
    deft_tensor *h = deft_tanh(deft_add(deft_matmul(n->x, n->params[0]), n->params[1]));
    deft_tensor *o = deft_mul(deft_add(deft_matmul(h, n->params[2]), n->params[3]), n->params[4]);
    n->loss = deft_mse_loss(o, n->y);
    CHECK_OK(deft_backward(n->loss));
    if (s->adamw) {
        deft_adamw_options a = deft_adamw_defaults();
        a.lr = s->lr;
        a.weight_decay = s->wd;
        n->opt = deft_adamw(n->g, &a, &s->step);
    } else {
        n->opt = deft_sgd(n->g, &(deft_sgd_options){.lr = s->lr, .momentum = 0.9, .weight_decay = s->wd}, &s->step);
    }
    CHECK_MSG(n->opt != NULL, "optimizer: %s", deft_errmsg());
    if (!n->opt) return 0;
    if (s->groups == 1) {
        deft_tensor *const grp[3] = {n->params[1], n->params[3], n->params[4]};
        const deft_param_group_options go = {.weight_decay = s->group_wd, .lr_scale = s->group_lr_scale};
        CHECK_OK(deft_optimizer_param_group(n->opt, grp, 3, &go));
    } else if (s->groups == 2) {
        CHECK_OK(deft_optimizer_decay_2d_only(n->opt));
    }
    n->step = deft_optimizer_step(n->opt);
    deft_tensor *outs[2 + PG_PARAMS] = {n->loss, n->step};
    for (int i = 0; i < PG_PARAMS; i++) outs[2 + i] = deft_grad(n->params[i]);
    n->prog = deft_compile(n->g, outs, 2 + PG_PARAMS, &s->copts);
    CHECK_MSG(n->prog != NULL, "compile: %s", deft_errmsg());
    if (!n->prog) return 0;
    CHECK_OK(deft_program_feed(n->prog, n->x, n->xv, (size_t)(s->batch * s->in) * sizeof(float)));
    CHECK_OK(deft_program_feed(n->prog, n->y, n->yv, (size_t)(s->batch * s->out) * sizeof(float)));
    return 1;
}

static void pg_free(pg_net *n) {
    deft_program_free(n->prog);
    deft_graph_free(n->g);
    free(n->xv);
    free(n->yv);
}

/* Every parameter's values, concatenated, into a malloc'd buffer (*count elements). */
static float *pg_params(const pg_net *n, int64_t *count) {
    int64_t total = 0;
    for (int i = 0; i < PG_PARAMS; i++) total += deft_tensor_numel(n->params[i]);
    float *v = malloc((size_t)total * sizeof *v), *at = v;
    for (int i = 0; i < PG_PARAMS; i++) {
        const int64_t c = deft_tensor_numel(n->params[i]);
        CHECK_OK(deft_param_get(n->params[i], at, (size_t)c * sizeof *at));
        at += c;
    }
    *count = total;
    return v;
}

#endif
