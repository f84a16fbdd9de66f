/* Optimizer parameter groups (deft_optimizer_param_group, deft_optimizer_decay_2d_only) on the CPU:
 *  1. AdamW and SGD (momentum) with two groups, different weight decay and learning-rate scale, against a plain
 *     reference loop over the gradients each run computed (torch.optim's formulas with per-group lr and decay), over
 *     several steps and an lr change; the same loop without the groups must disagree (the groups matter);
 *  2. the same through the general path (accumulation, clipping) and optimizer in backward (pieces): equal to the
 *     one-node step;
 *  3. decay_2d_only is the explicit group of the 1-D parameters with no decay;
 *  4. refusals, each leaving the optimizer as it was: a parameter in two groups, named twice, one the optimizer does
 *     not update, bad values, NULLs, and any change once a program running the step was compiled. */
#include "check.h"
#include "ref.h"
#include "param_groups_net.h"

static const pg_spec BASE = {.adamw = 1, .groups = 1, .lr = 0.05, .wd = 0.2, .group_wd = 0.0, .group_lr_scale = 2.5,
                             .in = 6, .hidden = 5, .out = 3, .batch = 8};

/* One parameter's reference state: values, and the moments (AdamW) or momentum buffer (SGD). */
typedef struct pg_ref {
    double *p, *m, *v;
    int64_t n;
} pg_ref;

/* torch.optim.AdamW (decoupled decay) and SGD (L2 added to the gradient, momentum starting at the first gradient)
 * for one parameter of a group with decay wd and rate lr, update number t (from 1). */
static void ref_update(pg_ref *r, const float *g, int adamw, double lr, double wd, int t) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int64_t j = 0; j < r->n; j++) {
        double d = g[j];
        if (adamw) {
            r->p[j] *= 1.0 - lr * wd;
            r->m[j] = b1 * r->m[j] + (1 - b1) * d;
            r->v[j] = b2 * r->v[j] + (1 - b2) * d * d;
            const double mh = r->m[j] / (1 - pow(b1, t)), vh = r->v[j] / (1 - pow(b2, t));
            r->p[j] -= lr * mh / (sqrt(vh) + eps);
        } else {
            d += wd * r->p[j];
            r->m[j] = t == 1 ? d : 0.9 * r->m[j] + d;
            r->p[j] -= lr * r->m[j];
        }
    }
}

/* Runs `steps` updates of the network (lr changed to lr2 after the second) and the reference beside it, each from
 * the gradients deft computed at the same values; returns the worst relative difference of the parameters, with
 * the reference taking the groups (use_groups) or ignoring them. */
static double run_against_reference(const pg_spec *s, int steps, double lr2, int use_groups) {
    pg_net n;
    if (!pg_build(&n, s, deft_cpu(), 7)) {
        pg_free(&n);
        return INFINITY;
    }
    pg_ref r[PG_PARAMS];
    for (int i = 0; i < PG_PARAMS; i++) {
        r[i].n = deft_tensor_numel(n.params[i]);
        r[i].p = calloc((size_t)r[i].n, sizeof(double));
        r[i].m = calloc((size_t)r[i].n, sizeof(double));
        r[i].v = calloc((size_t)r[i].n, sizeof(double));
        float *v = malloc((size_t)r[i].n * sizeof *v);
        CHECK_OK(deft_param_get(n.params[i], v, (size_t)r[i].n * sizeof *v));
        for (int64_t j = 0; j < r[i].n; j++) r[i].p[j] = v[j];
        free(v);
    }
    double worst = 0.0, lr = s->lr;
    for (int t = 1; t <= steps; t++) {
        if (t == 3) {
            CHECK_OK(deft_optimizer_set_lr(n.opt, lr2));
            lr = lr2;
        }
        CHECK_OK(deft_program_run(n.prog));
        for (int i = 0; i < PG_PARAMS; i++) {
            float *g = malloc((size_t)r[i].n * sizeof *g), *have = malloc((size_t)r[i].n * sizeof *have);
            CHECK_OK(deft_program_read(n.prog, deft_grad(n.params[i]), g, (size_t)r[i].n * sizeof *g));
            const int grouped = use_groups && (i == 1 || i == 3 || i == 4);
            ref_update(&r[i], g, s->adamw, grouped ? lr * s->group_lr_scale : lr, grouped ? s->group_wd : s->wd, t);
            CHECK_OK(deft_param_get(n.params[i], have, (size_t)r[i].n * sizeof *have));
            for (int64_t j = 0; j < r[i].n; j++) {
                const double e = fabs(have[j] - r[i].p[j]) / fmax(0.1, fabs(r[i].p[j]));
                if (!(e <= worst)) worst = e;
            }
            /* Go on from deft's values, so that one step's rounding is never compounded through the gradients. */
            for (int64_t j = 0; j < r[i].n; j++) r[i].p[j] = have[j];
            free(g);
            free(have);
        }
    }
    for (int i = 0; i < PG_PARAMS; i++) {
        free(r[i].p);
        free(r[i].m);
        free(r[i].v);
    }
    pg_free(&n);
    return worst;
}

static void test_against_reference(void) {
    for (int adamw = 0; adamw <= 1; adamw++) {
        pg_spec s = BASE;
        s.adamw = adamw;
        if (!adamw) s.lr = 0.02, s.wd = 0.05, s.group_wd = 0.5, s.group_lr_scale = 0.25;
        const double with = run_against_reference(&s, 5, s.lr * 0.5, 1);
        const double without = run_against_reference(&s, 5, s.lr * 0.5, 0);
        CHECK_MSG(with < 2e-5, "%s with groups: worst relative difference %g from the reference",
                  adamw ? "adamw" : "sgd", with);
        CHECK_MSG(without > 1e-3, "%s: the reference without groups is as close (%g): the groups did nothing",
                  adamw ? "adamw" : "sgd", without);
    }
}

/* The parameters after `steps` runs of spec s. */
static float *train(const pg_spec *s, int steps, int64_t *count) {
    pg_net n;
    float *v = NULL;
    if (pg_build(&n, s, deft_cpu(), 11)) {
        for (int t = 0; t < steps; t++) CHECK_OK(deft_program_run(n.prog));
        v = pg_params(&n, count);
    }
    pg_free(&n);
    return v;
}

/* a after steps_a runs against b after steps_b. */
static void check_same2(const char *what, const pg_spec *a, int steps_a, const pg_spec *b, int steps_b, int bitwise) {
    int64_t na = 0, nb = 0;
    float *va = train(a, steps_a, &na), *vb = train(b, steps_b, &nb);
    CHECK_MSG(va && vb && na == nb, "%s: no parameters", what);
    if (va && vb && na == nb) {
        double worst = 0.0;
        for (int64_t j = 0; j < na; j++) worst = fmax(worst, fabs((double)va[j] - vb[j]));
        if (bitwise) CHECK_MSG(memcmp(va, vb, (size_t)na * sizeof *va) == 0, "%s: differ (worst %g)", what, worst);
        else CHECK_MSG(worst < 1e-6, "%s: differ by %g", what, worst);
    }
    free(va);
    free(vb);
}

static void check_same(const char *what, const pg_spec *a, const pg_spec *b, int steps, int bitwise) {
    check_same2(what, a, steps, b, steps, bitwise);
}

static void test_paths(void) {
    for (int adamw = 0; adamw <= 1; adamw++) {
        pg_spec s = BASE, split = BASE;
        s.adamw = split.adamw = adamw;
        split.copts.optimizer_in_backward = 1;
        check_same(adamw ? "adamw: optimizer in backward" : "sgd: optimizer in backward", &s, &split, 4, 1);
        /* Clipping at a norm never reached and two micro-batches of the same batch step as one: the general path. */
        pg_spec clip = s, acc = s;
        clip.step.max_grad_norm = 1e9;
        check_same(adamw ? "adamw: clipping path" : "sgd: clipping path", &s, &clip, 4, 0);
        acc.step.accumulate_steps = 2;
        check_same2(adamw ? "adamw: accumulation path" : "sgd: accumulation path", &s, 1, &acc, 2, 0);
    }
    /* Without a group every path is the optimizer's own options: a group with the optimizer's values changes
     * nothing, bit for bit. */
    pg_spec none = BASE, same = BASE;
    none.groups = 0;
    same.group_wd = BASE.wd, same.group_lr_scale = 1.0;
    check_same("a group with the optimizer's own options", &none, &same, 4, 1);
}

static void test_decay_2d_only(void) {
    pg_spec helper = BASE, explicit_group = BASE;
    helper.groups = 2;
    explicit_group.group_wd = 0.0, explicit_group.group_lr_scale = 1.0;
    check_same("decay_2d_only", &helper, &explicit_group, 4, 1);
}

static void test_refusals(void) {
    deft_graph *g = deft_graph_new();
    const int64_t shape[2] = {3, 2};
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, shape, deft_cpu(), DEFT_INIT_UNIFORM);
    deft_tensor *b = deft_param(g, "b", DEFT_F32, 1, shape + 1, deft_cpu(), DEFT_INIT_ZEROS);
    deft_tensor *frozen = deft_param(g, "frozen", DEFT_F32, 1, shape + 1, deft_cpu(), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set_requires_grad(frozen, 0));
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (const int64_t[]){4, 3}, deft_cpu());
    deft_tensor *loss = deft_sum(deft_add(deft_add(deft_matmul(x, w), b), frozen), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_adamw(g, NULL, NULL);
    CHECK(opt != NULL);
    CHECK(deft_optimizer_param_count(opt) == 2);
    CHECK(deft_optimizer_param(opt, 0) == w && deft_optimizer_param(opt, 1) == b);
    CHECK(deft_optimizer_param(opt, 2) == NULL);
    const deft_param_group_options ok = {.weight_decay = 0.0, .lr_scale = 1.0};
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){frozen}, 1, &ok), DEFT_ERR_INVALID,
              "frozen is not a parameter this optimizer updates");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){x}, 1, &ok), DEFT_ERR_INVALID,
              "x is not a parameter this optimizer updates");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b, b}, 2, &ok), DEFT_ERR_INVALID,
              "b is named twice");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b, NULL}, 2, &ok), DEFT_ERR_INVALID,
              "parameter 1 is NULL");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b}, 1,
                                         &(deft_param_group_options){.weight_decay = -1.0}),
              DEFT_ERR_INVALID, "must be finite and >= 0");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b}, 1,
                                         &(deft_param_group_options){.lr_scale = NAN}),
              DEFT_ERR_INVALID, "must be finite and >= 0");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b}, 0, &ok), DEFT_ERR_INVALID, "0 parameters");
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){b}, 1, NULL), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_optimizer_param_group(NULL, (deft_tensor *const[]){b}, 1, &ok), DEFT_ERR_INVALID, "NULL");
    /* Every refusal above left b free: it joins a group now, and then cannot join another. */
    CHECK_OK(deft_optimizer_param_group(opt, (deft_tensor *const[]){b}, 1, &ok));
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){w, b}, 2, &ok), DEFT_ERR_INVALID,
              "b is already in group 0");
    /* w was not grouped by the refused call, and decay_2d_only finds nothing left to group (b is taken). */
    CHECK_OK(deft_optimizer_decay_2d_only(opt));
    deft_tensor *step = deft_optimizer_step(opt);
    deft_tensor *outs[2] = {loss, step};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    CHECK_ERR(deft_optimizer_param_group(opt, (deft_tensor *const[]){w}, 1, &ok), DEFT_ERR_STATE,
              "its groups are fixed");
    CHECK_ERR(deft_optimizer_decay_2d_only(opt), DEFT_ERR_STATE, "its groups are fixed");
    deft_program_free(p);
    deft_graph_free(g);
}

int main(void) {
    test_against_reference();
    test_paths();
    test_decay_2d_only();
    test_refusals();
    return deft_check_finish();
}
