/* A small classifier on a GPU for the failure tests (out of memory, failed launches, bad targets): x -> softmax ->
 * times a frozen parameter -> linear -> relu -> linear -> cross-entropy with y, its backward pass and SGD with
 * momentum. The frozen parameter is not the optimizer's, so compiling copies it to the device (what a failed compile
 * must give back). Two nets built with the
 * same sizes start from the same parameters, so a program that failed and recovered can be compared, loss for loss,
 * with one that never failed. Everything is static so each test uses what it needs. */
#ifndef DEFT_TEST_TRAIN_NET_H
#define DEFT_TEST_TRAIN_NET_H

#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ref.h"

#define NET_GPU deft_cuda(0)
#define NET_CLASSES 10

typedef struct train_net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_optimizer *opt;
    int64_t batch, in, hidden;
    float *hx;        /* a batch on the host */
    int32_t *hy;
} train_net;

/* The softmax comes first so that a run's first launch check is a node of known name ("first_softmax"). */
static inline int net_build(train_net *n, int64_t batch, int64_t in, int64_t hidden) {
    *n = (train_net){.batch = batch, .in = in, .hidden = hidden};
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 1234);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){batch, in}, NET_GPU);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){batch}, NET_GPU);
    deft_tensor *s = deft_set_name(deft_softmax(n->x, 1), "first_softmax");
    deft_tensor *scale = deft_param(n->g, "scale", DEFT_F32, 1, (int64_t[]){in}, NET_GPU, DEFT_INIT_ONES);
    CHECK_OK(deft_param_set_requires_grad(scale, 0));
    deft_tensor *h = deft_relu(deft_linear(deft_mul(deft_mul_scalar(s, (double)in), scale), hidden, "fc1", NULL));
    n->loss = deft_set_name(deft_cross_entropy(deft_linear(h, NET_CLASSES, "fc2", NULL), n->y), "loss");
    CHECK_OK(deft_backward(n->loss));
    n->opt = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
    n->step = deft_optimizer_step(n->opt);
    n->hx = malloc((size_t)(batch * in) * sizeof *n->hx);
    n->hy = malloc((size_t)batch * sizeof *n->hy);
    int ok = n->step && n->hx && n->hy && deft_graph_error(n->g) == DEFT_OK;
    CHECK_MSG(ok, "building the net: %s", deft_graph_errmsg(n->g));
    return ok;
}

static inline void net_free(train_net *n) {
    deft_graph_free(n->g);
    free(n->hx);
    free(n->hy);
    *n = (train_net){0};
}

/* The training program (loss and update); opts may be NULL. */
static inline deft_program *net_compile(train_net *n, const deft_compile_options *opts) {
    return deft_compile(n->g, (deft_tensor *[]){n->loss, n->step}, 2, opts);
}

/* Batch number k: the same on every net of the same sizes. */
static inline void net_make_batch(train_net *n, uint64_t k) {
    uint64_t rng = 0x5eed0000ull + k;
    for (int64_t i = 0; i < n->batch * n->in; i++) n->hx[i] = (float)ref_unif(&rng, -2, 2);
    for (int64_t r = 0; r < n->batch; r++) n->hy[r] = (int32_t)(ref_next(&rng) % NET_CLASSES);
}

static inline deft_status net_feed(train_net *n, deft_program *p) {
    deft_status s = deft_program_feed(p, n->x, n->hx, (size_t)(n->batch * n->in) * sizeof *n->hx);
    return s == DEFT_OK ? deft_program_feed(p, n->y, n->hy, (size_t)n->batch * sizeof *n->hy) : s;
}

/* Feeds batch k and runs one step: the run's status (feeding must succeed). */
static inline deft_status net_try_step(train_net *n, deft_program *p, uint64_t k) {
    net_make_batch(n, k);
    CHECK_OK(net_feed(n, p));
    return deft_program_run(p);
}

/* One step that must succeed, returning its loss (NaN when it did not). */
static inline float net_step(train_net *n, deft_program *p, uint64_t k) {
    float loss = NAN;
    deft_status s = net_try_step(n, p, k);
    CHECK_MSG(s == DEFT_OK, "run of batch %llu: %s", (unsigned long long)k, deft_errmsg());
    if (s == DEFT_OK) CHECK_OK(deft_program_read(p, n->loss, &loss, sizeof loss));
    return loss;
}

/* The losses of batches first .. first+count-1 on a fresh net of n's sizes that never failed. */
static inline void net_reference_losses(const train_net *n, uint64_t first, int count, float *out) {
    train_net r;
    for (int i = 0; i < count; i++) out[i] = NAN;
    if (!net_build(&r, n->batch, n->in, n->hidden)) return;
    deft_program *p = net_compile(&r, NULL);
    CHECK_MSG(p != NULL, "compiling the reference: %s", deft_errmsg());
    for (int i = 0; p && i < count; i++) out[i] = net_step(&r, p, first + (uint64_t)i);
    net_free(&r);
}

/* Losses of one program against the reference: the same kernels on the same data, so equal up to rounding that a
 * different arena address cannot change; the tolerance only guards against a library choosing another algorithm. */
static inline void net_check_losses(const char *what, const float *got, const float *want, int count) {
    for (int i = 0; i < count; i++)
        CHECK_MSG(isfinite(got[i]) && fabsf(got[i] - want[i]) <= 1e-5f * fabsf(want[i]),
                  "%s: step %d loss %.9g, the reference %.9g", what, i, got[i], want[i]);
}

static inline deft_memory_stats net_gpu_stats(void) {
    deft_memory_stats s;
    memset(&s, 0, sizeof s);
    CHECK_OK(deft_memory_stats_get(NET_GPU, &s));
    return s;
}

#endif
