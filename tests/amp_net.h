/* The mixed-precision tests' network: x [batch, in] -> linear, relu -> linear, relu -> linear -> cross-entropy with
 * i32 labels, its backward pass and SGD with momentum, on any device. The labels come from a fixed linear teacher,
 * so the net learns and the loss falls. Two nets built with the same sizes start from the same parameters and see
 * the same batches, so a program under autocast can be compared, step by step, with the f32 one. */
#ifndef DEFT_TEST_AMP_NET_H
#define DEFT_TEST_AMP_NET_H

#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ref.h"

typedef struct amp_net {
    deft_graph *g;
    deft_tensor *x, *y, *logits, *loss, *step, *w2;
    deft_optimizer *opt;
    int64_t batch, in, hidden, classes;
    float *hx;
    int32_t *hy;
} amp_net;

/* The optimizer of a net: SGD with momentum (lr 0.3, momentum 0.9), or AdamW (lr 0.01, torch's other defaults), with
 * these step options (NULL: one micro-batch per update, no clipping). */
typedef struct amp_optim {
    int adamw;
    const deft_step_options *step;
} amp_optim;

static inline int amp_build_with(amp_net *n, deft_device dev, int64_t batch, int64_t in, int64_t hidden,
                                 int64_t classes, amp_optim o) {
    *n = (amp_net){.batch = batch, .in = in, .hidden = hidden, .classes = classes};
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 4321);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){batch, in}, dev);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){batch}, dev);
    deft_tensor *h = deft_relu(deft_linear(n->x, hidden, "fc1", NULL));
    h = deft_relu(deft_linear(h, hidden, "fc2", NULL));
    n->logits = deft_set_name(deft_linear(h, classes, "fc3", NULL), "logits");
    n->loss = deft_set_name(deft_cross_entropy(n->logits, n->y), "loss");
    CHECK_OK(deft_backward(n->loss));
    deft_adamw_options aw = deft_adamw_defaults();
    aw.lr = 0.01;
    n->opt = o.adamw ? deft_adamw(n->g, &aw, o.step)
                     : deft_sgd(n->g, &(deft_sgd_options){.lr = 0.3, .momentum = 0.9}, o.step);
    n->step = deft_optimizer_step(n->opt);
    n->w2 = deft_graph_find(n->g, "fc2.weight");
    n->hx = malloc((size_t)(batch * in) * sizeof *n->hx);
    n->hy = malloc((size_t)batch * sizeof *n->hy);
    int ok = n->step && n->w2 && n->hx && n->hy && deft_graph_error(n->g) == DEFT_OK;
    CHECK_MSG(ok, "building the net: %s", deft_graph_errmsg(n->g));
    return ok;
}

static inline int amp_build(amp_net *n, deft_device dev, int64_t batch, int64_t in, int64_t hidden, int64_t classes) {
    return amp_build_with(n, dev, batch, in, hidden, classes, (amp_optim){0, NULL});
}

static inline void amp_free(amp_net *n) {
    deft_graph_free(n->g);
    free(n->hx);
    free(n->hy);
    *n = (amp_net){0};
}

static inline deft_program *amp_compile(amp_net *n, const deft_compile_options *o) {
    return deft_compile(n->g, (deft_tensor *[]){n->loss, n->step}, 2, o);
}

/* amp_build and amp_compile together; NULL (a failed check, the net freed) when either fails. */
static inline deft_program *amp_build_compiled(amp_net *n, deft_device dev, int64_t batch, int64_t in,
                                               int64_t hidden, int64_t classes, const deft_compile_options *o) {
    if (!amp_build(n, dev, batch, in, hidden, classes)) {
        amp_free(n);
        return NULL;
    }
    deft_program *p = amp_compile(n, o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) amp_free(n);
    return p;
}

/* Batch k: x uniform in [-1, 1] times `gain`, labels the argmax of a fixed teacher's scores. */
static inline void amp_make_batch(amp_net *n, uint64_t k, float gain) {
    uint64_t rng = 0xa3b0000ull + k;
    for (int64_t i = 0; i < n->batch * n->in; i++) n->hx[i] = (float)ref_unif(&rng, -1, 1);
    for (int64_t r = 0; r < n->batch; r++) {
        int best = 0;
        double best_s = -1e300;
        for (int64_t c = 0; c < n->classes; c++) {
            uint64_t t = 0x7eac4e7ull + (uint64_t)c;
            double s = 0;
            for (int64_t i = 0; i < n->in; i++) s += n->hx[r * n->in + i] * ref_unif(&t, -1, 1);
            if (s > best_s) best_s = s, best = (int)c;
        }
        n->hy[r] = best;
    }
    for (int64_t i = 0; i < n->batch * n->in; i++) n->hx[i] *= gain;
}

/* Feeds batch k (x times gain), runs one step and returns its loss (NaN when the run failed). */
static inline float amp_step(amp_net *n, deft_program *p, uint64_t k, float gain) {
    float loss = NAN;
    amp_make_batch(n, k, gain);
    CHECK_OK(deft_program_feed(p, n->x, n->hx, (size_t)(n->batch * n->in) * sizeof *n->hx));
    CHECK_OK(deft_program_feed(p, n->y, n->hy, (size_t)n->batch * sizeof *n->hy));
    deft_status s = deft_program_run(p);
    CHECK_MSG(s == DEFT_OK, "run of batch %llu: %s", (unsigned long long)k, deft_errmsg());
    if (s == DEFT_OK) CHECK_OK(deft_program_read(p, n->loss, &loss, sizeof loss));
    return loss;
}

/* fc2's weight (hidden x hidden floats) into w. */
static inline void amp_weight(amp_net *n, float *w) {
    CHECK_OK(deft_param_get(n->w2, w, (size_t)(n->hidden * n->hidden) * sizeof *w));
}

#endif
