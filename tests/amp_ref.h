/* A reference for the autocast optimizer (tests/test_autocast_optimizer.c, cuda_test_autocast_optimizer.c): the same
 * training as an amp_net compiled under autocast, with the optimizer fed f32 gradients the way it was before it read
 * bf16/f16 ones itself.
 *
 * Three graphs on one device take part. `net` (the amp_net under test) trains under autocast; its step reads the
 * low-precision gradients. `grads` is a second amp_net with the same parameters, compiled under the same autocast
 * for its loss and deft_grad() of every parameter: reading those as outputs keeps their casts back to f32, so it
 * gives the f32 gradients the old step read. `opt` is a graph of the same parameters (same names, shapes, order,
 * optimizer and step options) whose loss is the sum of param * g over an f32 input g per parameter: its gradient is
 * g exactly (1 * g), so its optimizer step, deft's own f32 path, applies the update to the f32 gradients of `grads`.
 * After each step the updated parameters go back into `grads`. Both trainings then see the same parameters, so their
 * losses agree bit for bit step by step and the parameters of `net` and `opt` after N steps must too. */
#ifndef DEFT_TEST_AMP_REF_H
#define DEFT_TEST_AMP_REF_H

#include "amp_net.h"
#include "deft_testing.h"

#define AMP_REF_MAX 8

typedef struct amp_ref {
    amp_net grads;                       /* gives the f32 gradients */
    deft_program *grads_p;
    deft_tensor *grad_of[AMP_REF_MAX];   /* in grads.g: deft_grad of each parameter */
    deft_graph *g;                       /* the f32 optimizer's graph */
    deft_tensor *param[AMP_REF_MAX], *gin[AMP_REF_MAX], *loss, *step;
    deft_optimizer *opt;
    deft_program *p;
    int n;
    float *buf;                          /* one parameter's values or gradient at a time */
} amp_ref;

/* The parameters of n->opt, in its flat order. */
static inline deft_tensor *amp_param(const amp_net *n, int i) { return deft_testing_optimizer_param(n->opt, i); }

static inline int amp_ref_build_opt(amp_ref *r, const amp_net *net, deft_device dev, amp_optim o) {
    r->g = deft_graph_new();
    deft_tensor *loss = NULL;
    for (int i = 0; i < r->n; i++) {
        const deft_tensor *w = amp_param(net, i);
        char name[80];
        snprintf(name, sizeof name, "%s.grad_in", deft_tensor_name(w));
        const int ndim = deft_tensor_ndim(w);
        const int64_t *shape = deft_testing_shape(w);
        r->param[i] = deft_param(r->g, deft_tensor_name(w), DEFT_F32, ndim, shape, dev, DEFT_INIT_ZEROS);
        r->gin[i] = deft_input(r->g, name, DEFT_F32, ndim, shape, dev);
        deft_tensor *term = deft_sum(deft_mul(r->param[i], r->gin[i]), 0, NULL, 0);
        loss = loss ? deft_add(loss, term) : term;
    }
    r->loss = loss;
    CHECK_OK(deft_backward(loss));
    deft_adamw_options aw = deft_adamw_defaults();
    aw.lr = 0.01;
    r->opt = o.adamw ? deft_adamw(r->g, &aw, o.step)
                     : deft_sgd(r->g, &(deft_sgd_options){.lr = 0.3, .momentum = 0.9}, o.step);
    r->step = deft_optimizer_step(r->opt);
    r->p = r->step ? deft_compile(r->g, &r->step, 1, NULL) : NULL;
    CHECK_MSG(r->p != NULL, "the reference optimizer: %s", deft_errmsg());
    return r->p != NULL;
}

/* Builds the reference of `net` (already built, not yet run) on dev with net's optimizer `o`, its gradients computed
 * under autocast `dt`. */
static inline int amp_ref_build(amp_ref *r, const amp_net *net, deft_device dev, amp_optim o, deft_dtype dt) {
    const deft_compile_options ac = {.autocast = dt};
    *r = (amp_ref){.n = deft_testing_optimizer_param_count(net->opt)};
    if (r->n > AMP_REF_MAX || !amp_build_with(&r->grads, dev, net->batch, net->in, net->hidden, net->classes, o))
        return 0;
    deft_tensor *outs[AMP_REF_MAX + 1] = {r->grads.loss};
    for (int i = 0; i < r->n; i++) outs[i + 1] = r->grad_of[i] = deft_grad(amp_param(&r->grads, i));
    r->grads_p = deft_compile(r->grads.g, outs, r->n + 1, &ac);
    CHECK_MSG(r->grads_p != NULL, "the reference gradients: %s", deft_errmsg());
    int64_t most = 1;
    for (int i = 0; i < r->n; i++)
        if (deft_tensor_numel(amp_param(net, i)) > most) most = deft_tensor_numel(amp_param(net, i));
    r->buf = malloc((size_t)most * sizeof *r->buf);
    if (!r->grads_p || !r->buf || !amp_ref_build_opt(r, net, dev, o)) return 0;
    /* The same starting values everywhere (the nets are seeded alike; the reference optimizer's graph is not). */
    for (int i = 0; i < r->n; i++) {
        const size_t bytes = (size_t)deft_tensor_numel(r->param[i]) * sizeof(float);
        CHECK_OK(deft_param_get(amp_param(net, i), r->buf, bytes));
        CHECK_OK(deft_param_set(r->param[i], r->buf, bytes));
    }
    return 1;
}

/* One step of the reference on batch k: the f32 gradients from `grads`, the update by the f32 optimizer, the new
 * values back into `grads`. Returns the loss (the one before the update, as amp_step's). */
static inline float amp_ref_step(amp_ref *r, uint64_t k) {
    float loss = amp_step(&r->grads, r->grads_p, k, 1.0f);
    for (int i = 0; i < r->n; i++) {
        const size_t bytes = (size_t)deft_tensor_numel(r->param[i]) * sizeof(float);
        CHECK_OK(deft_program_read(r->grads_p, r->grad_of[i], r->buf, bytes));
        CHECK_OK(deft_program_feed(r->p, r->gin[i], r->buf, bytes));
    }
    CHECK_OK(deft_program_run(r->p));
    for (int i = 0; i < r->n; i++) {
        const size_t bytes = (size_t)deft_tensor_numel(r->param[i]) * sizeof(float);
        CHECK_OK(deft_param_get(r->param[i], r->buf, bytes));
        CHECK_OK(deft_param_set(amp_param(&r->grads, i), r->buf, bytes));
    }
    return loss;
}

/* How many parameters of net differ from the reference's in any bit (each one printed). */
static inline int amp_ref_differs(amp_ref *r, const amp_net *net, const char *what) {
    int bad = 0;
    for (int i = 0; i < r->n; i++) {
        const int64_t n = deft_tensor_numel(r->param[i]);
        float *mine = malloc((size_t)n * sizeof *mine);
        if (!mine) return r->n;
        CHECK_OK(deft_param_get(amp_param(net, i), mine, (size_t)n * sizeof *mine));
        CHECK_OK(deft_param_get(r->param[i], r->buf, (size_t)n * sizeof *mine));
        int64_t first = -1;
        for (int64_t j = 0; j < n && first < 0; j++)
            if (memcmp(&mine[j], &r->buf[j], sizeof *mine) != 0) first = j;
        if (first >= 0) {
            fprintf(stderr, "%s: %s[%lld] is %.9g, the f32-gradient reference %.9g\n", what,
                    deft_tensor_name(r->param[i]), (long long)first, mine[first], r->buf[first]);
            bad++;
        }
        free(mine);
    }
    return bad;
}

static inline void amp_ref_free(amp_ref *r) {
    deft_graph_free(r->g);
    amp_free(&r->grads);
    free(r->buf);
    *r = (amp_ref){0};
}

/* Trains net (built with optimizer `o`, compiled as p under autocast dt with whatever other options) and its
 * reference for `steps` runs from batch 0: the losses agree bit for bit at every step, and the parameters at the end.
 * Returns the number of checks that failed. */
static inline int amp_ref_compare(amp_net *net, deft_program *p, deft_device dev, amp_optim o, deft_dtype dt,
                                  int steps, const char *what) {
    amp_ref r;
    const int before = deft_check_failures;
    if (!amp_ref_build(&r, net, dev, o, dt)) {
        amp_ref_free(&r);
        return 1;
    }
    for (int k = 0; k < steps; k++) {
        const float mine = amp_step(net, p, (uint64_t)k, 1.0f), ref = amp_ref_step(&r, (uint64_t)k);
        CHECK_MSG(isfinite(mine) && memcmp(&mine, &ref, sizeof mine) == 0, "%s step %d: loss %.9g, reference %.9g",
                  what, k, mine, ref);
    }
    const int bad = amp_ref_differs(&r, net, what);
    CHECK_MSG(bad == 0, "%s: %d of %d parameters differ from the f32-gradient reference after %d steps", what, bad,
              r.n, steps);
    printf("%s: %d steps, parameters %s the f32-gradient reference\n", what, steps,
           bad == 0 ? "bit-identical to" : "DIFFERENT from");
    amp_ref_free(&r);
    return deft_check_failures - before;
}

/* The optimizer nodes p schedules, and how many of their sources are in dtype dt. */
static inline int amp_step_sources(const deft_program *p, const deft_graph *g, deft_dtype dt, int *steps) {
    int n = 0;
    *steps = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (!deft_testing_is_op(t, "optimizer") || !deft_program_schedules(p, t)) continue;
        ++*steps;
        for (int k = 0; k < deft_testing_src_count(t); k++) n += deft_tensor_dtype(deft_testing_src(t, k)) == dt;
    }
    return n;
}

/* The cast to f32 of a low-precision gradient the step reads (the node it read before), or NULL. */
static inline const deft_tensor *amp_cast_back(const deft_graph *g, const deft_tensor *low) {
    for (int id = deft_testing_node_id(low) + 1; id < deft_graph_node_count(g); id++) {
        const deft_tensor *t = deft_testing_node(g, id);
        if (deft_testing_is_op(t, "cast") && deft_tensor_dtype(t) == DEFT_F32 && deft_testing_src(t, 0) == low)
            return t;
    }
    return NULL;
}

#endif
