/* The MLP the data parallel tests train on several GPUs (cuda_test_dist.c, cuda_test_zero.c): LAYERS linear layers of
 * WIDTH (the last to CLASSES), ReLU between, cross-entropy, an optimizer the test makes; batches hashed from the step
 * and the row, so that rank k of a step takes rows k B .. (k + 1) B - 1 of one global batch. Include after check.h. */
#ifndef DEFT_TEST_DIST_MLP_H
#define DEFT_TEST_DIST_MLP_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LAYERS 4
#define WIDTH 256
#define CLASSES 10

typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_tensor *extra;   /* mlp_build_extra's output, NULL without */
    deft_tensor *params[2 * LAYERS];
    deft_optimizer *opt;
    deft_program *p;
} mlp;

/* Makes the optimizer of g (its parameters exist, with gradients): NULL on a failure. */
typedef deft_optimizer *(*mlp_optimizer_fn)(deft_graph *g, void *ctx);

static inline float data_x(int64_t step, int64_t row, int64_t col) {
    uint32_t h = (uint32_t)(step * 7919 + row * 104729 + col * 31 + 17);
    h ^= h >> 16, h *= 0x45d9f3bu, h ^= h >> 16, h *= 0x45d9f3bu, h ^= h >> 16;
    return (float)h / 4294967296.0f * 2.0f - 1.0f;
}

static inline int32_t data_y(int64_t step, int64_t row) { return (int32_t)((step * 13 + row * 7) % CLASSES); }

/* The MLP on dev with `batch` rows and the optimizer make_opt gives; every build has the same initial parameters (the
 * graph's seed). With extra_param (a parameter's name; NULL: none) the program has a third output, m->extra, the sum
 * of that parameter read in f32. Compiled with o (NULL: the defaults): 0 (checked) when that fails. */
static inline int mlp_build_extra(mlp *m, deft_device dev, int64_t batch, const deft_compile_options *o,
                                  mlp_optimizer_fn make_opt, void *ctx, const char *extra_param) {
    *m = (mlp){.g = deft_graph_new()};
    deft_graph_set_seed(m->g, 1234);
    m->x = deft_input(m->g, "x", DEFT_F32, 2, (int64_t[]){batch, WIDTH}, dev);
    m->y = deft_input(m->g, "y", DEFT_I32, 1, (int64_t[]){batch}, dev);
    deft_tensor *h = m->x;
    for (int l = 0; l < LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        h = deft_linear(h, l == LAYERS - 1 ? CLASSES : WIDTH, name, NULL);
        if (l < LAYERS - 1) h = deft_relu(h);
    }
    m->loss = deft_cross_entropy(h, m->y);
    if (!m->loss || deft_backward(m->loss) != DEFT_OK) return 0;
    m->opt = make_opt(m->g, ctx);
    m->step = deft_optimizer_step(m->opt);
    for (int l = 0; l < LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "fc%d.weight", l);
        m->params[2 * l] = deft_graph_find(m->g, name);
        snprintf(name, sizeof name, "fc%d.bias", l);
        m->params[2 * l + 1] = deft_graph_find(m->g, name);
    }
    if (extra_param) m->extra = deft_sum(deft_graph_find(m->g, extra_param), 0, NULL, 0);
    m->p = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step, m->extra}, m->extra ? 3 : 2, o);
    CHECK_MSG(m->p != NULL, "compile: %s", deft_errmsg());
    return m->p != NULL;
}

static inline int mlp_build_with(mlp *m, deft_device dev, int64_t batch, const deft_compile_options *o,
                                 mlp_optimizer_fn make_opt, void *ctx) {
    return mlp_build_extra(m, dev, batch, o, make_opt, ctx, NULL);
}

/* Feeds rows [first, first + batch) of step's global batch. */
static inline void mlp_feed(mlp *m, int64_t step, int64_t first, int64_t batch) {
    float *x = malloc((size_t)(batch * WIDTH) * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    for (int64_t r = 0; r < batch; r++) {
        for (int64_t c = 0; c < WIDTH; c++) x[r * WIDTH + c] = data_x(step, first + r, c);
        y[r] = data_y(step, first + r);
    }
    CHECK_OK(deft_program_feed(m->p, m->x, x, (size_t)(batch * WIDTH) * sizeof *x));
    CHECK_OK(deft_program_feed(m->p, m->y, y, (size_t)batch * sizeof *y));
    free(x);
    free(y);
}

static inline size_t mlp_param_floats(const mlp *m) {
    size_t n = 0;
    for (int i = 0; i < 2 * LAYERS; i++) n += (size_t)deft_tensor_numel(m->params[i]);
    return n;
}

/* Every parameter's values, layer by layer, into out (mlp_param_floats of them). */
static inline void mlp_params(const mlp *m, float *out) {
    for (int i = 0; i < 2 * LAYERS; i++) {
        CHECK_OK(deft_param_get(m->params[i], out, deft_tensor_nbytes(m->params[i])));
        out += deft_tensor_numel(m->params[i]);
    }
}

static inline double max_rel_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + 1e-3);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

#endif
