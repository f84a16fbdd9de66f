/* Gradients against central finite differences, in float64 on the CPU (test_autodiff.c, test_autodiff_conv.c):
 * parameters filled with uniform values, a loss sum(f * r) with a fixed random r (so every element of f's gradient
 * carries a different weight), and the worst relative difference between deft's gradient of a parameter and
 * (loss(v + h) - loss(v - h)) / 2h, element by element. Include after check.h and ref.h. */
#ifndef DEFT_TEST_GRAD_CHECK_H
#define DEFT_TEST_GRAD_CHECK_H

/* An f64 parameter named p<index> on the CPU, uniform in [lo, hi). */
static inline deft_tensor *grad_check_param(deft_graph *g, uint64_t *seed, int index, int ndim, const int64_t *shape,
                                            double lo, double hi) {
    char name[16];
    snprintf(name, sizeof name, "p%d", index);
    deft_tensor *p = deft_param(g, name, DEFT_F64, ndim, shape, deft_cpu(), DEFT_INIT_ZEROS);
    int64_t n = deft_tensor_numel(p);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = ref_unif(seed, lo, hi);
    CHECK_OK(deft_param_set(p, v, (size_t)n * sizeof *v));
    free(v);
    return p;
}

/* sum(f * r), r uniform in [-1, 1). */
static inline deft_tensor *grad_check_loss(deft_graph *g, uint64_t *seed, deft_tensor *f) {
    int64_t n = deft_tensor_numel(f), shape[DEFT_MAX_DIMS];
    for (int d = 0; d < deft_tensor_ndim(f); d++) shape[d] = deft_tensor_dim(f, d);
    double *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = ref_unif(seed, -1.0, 1.0);
    deft_tensor *wt = deft_constant(g, DEFT_F64, deft_tensor_ndim(f), shape, deft_cpu(), w, (size_t)n * sizeof *w);
    free(w);
    return deft_sum(deft_mul(f, wt), 0, NULL, 0);
}

static inline double grad_check_run(deft_program *p, deft_tensor *loss) {
    double v = NAN;
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, loss, &v, sizeof v));
    return v;
}

/* The largest |numeric - analytic| / max(1, |numeric|) over the elements of param, whose gradient p computes as
 * `grad` (p's last run must have been at the parameter's current values). */
static inline double grad_check_worst(deft_program *p, deft_tensor *loss, deft_tensor *grad, deft_tensor *param) {
    int64_t n = deft_tensor_numel(param);
    size_t bytes = (size_t)n * sizeof(double);
    double *analytic = malloc(bytes ? bytes : 1), *v = malloc(bytes ? bytes : 1), worst = 0.0;
    CHECK_OK(deft_program_read(p, grad, analytic, bytes));
    CHECK_OK(deft_param_get(param, v, bytes));
    for (int64_t j = 0; j < n; j++) {
        const double h = 1e-6, keep = v[j];
        v[j] = keep + h;
        deft_param_set(param, v, bytes);
        double up = grad_check_run(p, loss);
        v[j] = keep - h;
        deft_param_set(param, v, bytes);
        double down = grad_check_run(p, loss);
        v[j] = keep;
        deft_param_set(param, v, bytes);
        double numeric = (up - down) / (2 * h);
        double err = fabs(numeric - analytic[j]) / fmax(1.0, fabs(numeric));
        if (err > worst) worst = err;
    }
    free(analytic);
    free(v);
    return worst;
}

#define GRAD_CHECK_MAX_PARAMS 8

/* The whole check of one case: the loss of f, its backward pass, one program for the loss and every parameter's
 * gradient, the inputs fed (input_data[i] holds inputs[i]'s values), and each gradient within tol of the finite
 * differences. */
static inline void grad_check_case(const char *name, deft_graph *g, uint64_t *seed, deft_tensor *f,
                                   deft_tensor *const *params, int n_params, deft_tensor *const *inputs,
                                   double *const *input_data, int n_inputs, double tol) {
    CHECK_MSG(n_params <= GRAD_CHECK_MAX_PARAMS, "%s: %d parameters, at most %d", name, n_params,
              GRAD_CHECK_MAX_PARAMS);
    deft_tensor *loss = grad_check_loss(g, seed, f);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[1 + GRAD_CHECK_MAX_PARAMS] = {loss};
    for (int i = 0; i < n_params && i < GRAD_CHECK_MAX_PARAMS; i++) outs[1 + i] = deft_grad(params[i]);
    deft_program *p = deft_compile(g, outs, 1 + n_params, NULL);
    CHECK_MSG(p != NULL, "%s: compile: %s", name, deft_errmsg());
    if (!p) return;
    for (int i = 0; i < n_inputs; i++)
        CHECK_OK(deft_program_feed(p, inputs[i], input_data[i], deft_tensor_nbytes(inputs[i])));
    grad_check_run(p, loss);
    for (int i = 0; i < n_params; i++) {
        double worst = grad_check_worst(p, loss, outs[1 + i], params[i]);
        CHECK_MSG(worst <= tol, "%s: gradient of p%d off by %.3g (tol %g)", name, i, worst, tol);
    }
}

#endif
