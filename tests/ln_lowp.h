/* A small pre-norm transformer block under autocast, for layer norm's low-precision value (ir/autocast_layer_norm.c):
 *
 *   s  = x + fc1(x)                 the residual stream, f32 (x an input)
 *   y1 = layer_norm(s, w1, b1)      read by one product           -> its value in L
 *   h  = s + fc2(y1)
 *   y2 = layer_norm(h, w2, b2)      read by two products          -> its value in L
 *   h2 = h + fc3(y2) + fc4(y2)
 *   y3 = layer_norm(h2, w3)         read by a product and an add  -> stays f32, cast for the product
 *   loss = mean((y3 + fc5(y3))^2)
 *
 * compiled under bf16 or f16 autocast with the new form (the default) and with the debug knob LN_WIDE (the f32
 * layer norm, then the cast). The two programs must give the same loss and every parameter gradient bit for bit,
 * the plan's activation bytes must fall by the f32 values of y1 and y2 (each the product reads in L, so the arena
 * drops the f32 copy the backward pass kept for the statistics; by half of them where the wide program recomputes
 * the L cast from the f32 value rather than keep it), and the f32 nodes y1 and y2 are not computed at all while y3
 * is; checkpointed in two segments (the new nodes recomputed in the backward pass), the same bits again. Shared by
 * test_layer_norm_lowp.c (CPU) and cuda_test_layer_norm_lowp.c. */
#ifndef DEFT_TEST_LN_LOWP_H
#define DEFT_TEST_LN_LOWP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

#define LNL_PARAMS 15

typedef struct lnl_block {
    deft_graph *g;
    deft_tensor *x, *s, *loss, *y[3];
    deft_tensor *params[LNL_PARAMS], *grads[LNL_PARAMS];
    int n_params;
    int64_t shape[3];
} lnl_block;

typedef struct lnl_run {
    float loss;
    void *grads[LNL_PARAMS];   /* raw f32 bytes */
    size_t grad_bytes[LNL_PARAMS];
    size_t activation_bytes;
    int y_step[3];             /* the f32 layer norms' steps (-1: not computed) */
    const char *s_group;       /* the fused group computing s, or NULL */
} lnl_run;

static inline deft_tensor *lnl_vector(lnl_block *b, const char *name, double mean, deft_device dev) {
    const int64_t c = b->shape[2];
    deft_tensor *p = deft_param(b->g, name, DEFT_F32, 1, &c, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_init_normal(p, mean, 0.2, 0));
    b->params[b->n_params++] = p;
    return p;
}

/* x @ w + bias, as deft_linear builds it, with its parameters kept for their gradients. */
static inline deft_tensor *lnl_linear(lnl_block *b, deft_tensor *x, const char *name) {
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    const int64_t ws[2] = {b->shape[2], b->shape[2]};
    deft_tensor *w = deft_param(b->g, wn, DEFT_F32, 2, ws, deft_tensor_device(x), DEFT_INIT_KAIMING);
    deft_tensor *bias = deft_param(b->g, bn, DEFT_F32, 1, ws, deft_tensor_device(x), DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_init_normal(bias, 0.0, 0.1, 0));
    b->params[b->n_params++] = w;
    b->params[b->n_params++] = bias;
    return deft_add(deft_matmul(x, w), bias);
}

static inline int lnl_build(lnl_block *b, deft_device dev, int64_t batch, int64_t seq, int64_t c) {
    memset(b, 0, sizeof *b);
    b->shape[0] = batch, b->shape[1] = seq, b->shape[2] = c;
    b->g = deft_graph_new();
    deft_graph_set_seed(b->g, 0x1a10f);
    b->x = deft_input(b->g, "x", DEFT_F32, 3, b->shape, dev);
    b->s = deft_add(b->x, lnl_linear(b, b->x, "fc1"));
    b->y[0] = deft_layer_norm(b->s, lnl_vector(b, "w1", 1.0, dev), lnl_vector(b, "b1", 0.0, dev), 1e-5);
    deft_tensor *h = deft_add(b->s, lnl_linear(b, b->y[0], "fc2"));
    b->y[1] = deft_layer_norm(h, lnl_vector(b, "w2", 1.0, dev), lnl_vector(b, "b2", 0.0, dev), 1e-5);
    deft_tensor *h2 = deft_add(deft_add(h, lnl_linear(b, b->y[1], "fc3")), lnl_linear(b, b->y[1], "fc4"));
    b->y[2] = deft_layer_norm(h2, lnl_vector(b, "w3", 1.0, dev), NULL, 1e-5);
    deft_tensor *out = deft_add(b->y[2], lnl_linear(b, b->y[2], "fc5"));
    b->loss = deft_mean(deft_mul(out, out), 0, NULL, 0);
    CHECK_MSG(b->loss != NULL && b->n_params == LNL_PARAMS, "build: %s", deft_graph_errmsg(b->g));
    if (!b->loss || b->n_params != LNL_PARAMS || deft_backward(b->loss) != DEFT_OK) return 0;
    for (int i = 0; i < LNL_PARAMS; i++) b->grads[i] = deft_grad(b->params[i]);
    return 1;
}

static inline size_t lnl_activations(const deft_program *p) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    return n == 1 ? fp[0].activation_bytes : 0;
}

/* One step of the block on dev under autocast dt, with the f32 layer norms cast down (wide) or not, checkpointed in
 * `segments` segments (0: not); x from a fixed seed. */
static inline int lnl_step(deft_device dev, const int64_t *shape, deft_dtype dt, int wide, int segments,
                           lnl_run *r) {
    memset(r, 0, sizeof *r);
    lnl_block b;
    if (!lnl_build(&b, dev, shape[0], shape[1], shape[2])) return 0;
    CHECK_OK(deft_testing_set_debug("LN_WIDE", wide));
    deft_tensor *outs[1 + LNL_PARAMS] = {b.loss};
    for (int i = 0; i < LNL_PARAMS; i++) outs[1 + i] = b.grads[i];
    const deft_compile_options o = {.autocast = dt, .checkpoint = segments ? DEFT_CHECKPOINT_SEGMENTS : 0,
                                     .checkpoint_segments = segments};
    deft_program *p = deft_compile(b.g, outs, 1 + LNL_PARAMS, &o);
    CHECK_OK(deft_testing_set_debug("LN_WIDE", 0));
    CHECK_MSG(p != NULL, "compile (%s, wide %d): %s", deft_dtype_name(dt), wide, deft_errmsg());
    int ok = 0;
    if (p) {
        const int64_t n = shape[0] * shape[1] * shape[2];
        uint64_t rng = 0x5eedull;
        float *hx = malloc((size_t)n * sizeof *hx);
        for (int64_t i = 0; i < n; i++) hx[i] = (float)ref_unif(&rng, -1.5, 2.5);
        ok = deft_program_feed(p, b.x, hx, (size_t)n * sizeof *hx) == DEFT_OK && deft_program_run(p) == DEFT_OK &&
             deft_program_read(p, b.loss, &r->loss, sizeof r->loss) == DEFT_OK;
        for (int i = 0; ok && i < LNL_PARAMS; i++) {
            r->grad_bytes[i] = (size_t)deft_tensor_numel(b.grads[i]) * sizeof(float);
            r->grads[i] = malloc(r->grad_bytes[i]);
            ok = deft_program_read(p, b.grads[i], r->grads[i], r->grad_bytes[i]) == DEFT_OK;
        }
        CHECK_MSG(ok, "run (%s, wide %d): %s", deft_dtype_name(dt), wide, deft_errmsg());
        r->activation_bytes = lnl_activations(p);
        for (int k = 0; k < 3; k++) {
            deft_testing_node_plan np;
            const deft_tensor *m = deft_testing_autocast_latest(b.g, b.y[k]);   /* the f32 layer norm it computes */
            CHECK_MSG(m && deft_tensor_dtype(m) == DEFT_F32, "y%d has no f32 counterpart", k + 1);
            deft_testing_program_node_plan(p, m ? m : b.y[k], &np);
            r->y_step[k] = np.step;
        }
        deft_testing_node_plan sp;
        const deft_tensor *sm = deft_testing_autocast_latest(b.g, b.s);   /* the add the program computes */
        deft_testing_program_node_plan(p, sm ? sm : b.s, &sp);
        r->s_group = sp.group_kind;   /* a static name */
        free(hx);
        deft_program_free(p);
    }
    deft_graph_free(b.g);
    return ok;
}

static inline void lnl_free(lnl_run *r) {
    for (int i = 0; i < LNL_PARAMS; i++) free(r->grads[i]);
    memset(r, 0, sizeof *r);
}

static inline int lnl_same_bits(const lnl_run *a, const lnl_run *b) {
    if (memcmp(&a->loss, &b->loss, sizeof a->loss) != 0) return 0;
    for (int i = 0; i < LNL_PARAMS; i++)
        if (!a->grads[i] || !b->grads[i] || memcmp(a->grads[i], b->grads[i], a->grad_bytes[i]) != 0) return 0;
    return 1;
}

/* The new form against LN_WIDE under dt on dev: bits, activation bytes, which nodes run. Returns the new form's
 * run in *keep (for a comparison across devices) when keep is not NULL. */
static inline void lnl_check(deft_device dev, const int64_t *shape, deft_dtype dt, lnl_run *keep) {
    lnl_run low, wide;
    char what[96];
    snprintf(what, sizeof what, "%s [%lld, %lld, %lld]", deft_dtype_name(dt), (long long)shape[0],
             (long long)shape[1], (long long)shape[2]);
    if (lnl_step(dev, shape, dt, 0, 0, &low) && lnl_step(dev, shape, dt, 1, 0, &wide)) {
        CHECK_MSG(lnl_same_bits(&low, &wide), "%s: the low-precision layer norms change the loss or a gradient", what);
        /* each of y1 and y2 drops its f32 value (256-aligned: the shapes keep it so) */
        const size_t f32_value = (size_t)(shape[0] * shape[1] * shape[2]) * 4;
        printf("%s: loss %.9g; activation bytes %zu (f32 layer norms cast down: %zu)\n", what, (double)low.loss,
               low.activation_bytes, wide.activation_bytes);
        /* LN_WIDE keeps the f32 value for the statistics, and either keeps its L cast for the product's weight
         * gradient too (then the new form saves the f32 value) or recomputes that cast from it in the backward pass
         * (the cheap recomputes of passes/checkpoint.h: then it saves the f32 value less the L one, half of it) */
        const size_t saved = wide.activation_bytes - low.activation_bytes;
        CHECK_MSG(wide.activation_bytes > low.activation_bytes && (saved == 2 * f32_value || saved == f32_value),
                  "%s: activation bytes %zu, want %zu less 2 x %zu (or 2 x %zu)", what, low.activation_bytes,
                  wide.activation_bytes, f32_value, f32_value / 2);
        CHECK_MSG(low.y_step[0] < 0 && low.y_step[1] < 0 && low.y_step[2] >= 0,
                  "%s: the f32 layer norms computed: y1 step %d, y2 step %d, y3 step %d (want -1, -1, >= 0)", what,
                  low.y_step[0], low.y_step[1], low.y_step[2]);
        CHECK_MSG(wide.y_step[0] >= 0 && wide.y_step[1] >= 0 && wide.y_step[2] >= 0,
                  "%s: LN_WIDE did not compute every f32 layer norm", what);
        CHECK_MSG(isfinite(low.loss) && low.loss > 0, "%s: loss %g", what, (double)low.loss);
    }
    lnl_run ckpt;   /* the low-precision layer norms recomputed in the backward pass: the same bits */
    if (low.grads[0] && lnl_step(dev, shape, dt, 0, 2, &ckpt)) {
        CHECK_MSG(lnl_same_bits(&low, &ckpt), "%s: checkpointed in 2 segments, the loss or a gradient differs", what);
        CHECK_MSG(ckpt.activation_bytes < low.activation_bytes, "%s: checkpointing dropped nothing (%zu bytes)", what,
                  ckpt.activation_bytes);
    }
    lnl_free(&ckpt);
    if (keep) *keep = low;
    else lnl_free(&low);
    lnl_free(&wide);
}

#endif
