/* The training-state tests' network, on any device: x [B, IN] -> linear "fc1" -> times a frozen parameter "scale"
 * (not the optimizer's, so only the file's parameter records restore it) -> [layer norm "ln" -> gelu -> dropout |
 * relu] -> linear "fc2" -> cross-entropy with y, its backward pass and SGD with momentum or AdamW. Two nets built with
 * one config start from the same parameters, so a net trained on from a loaded state can be compared, loss for loss
 * and bit for bit, with the one that saved it and never stopped (the optimizers' rate, scale and counters too), also
 * when a loader over one fixed dataset feeds them. Everything is static: each test uses what it needs. */
#ifndef DEFT_TEST_TRAIN_STATE_NET_H
#define DEFT_TEST_TRAIN_STATE_NET_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

#define TS_B 16
#define TS_IN 12
#define TS_CLS 5
#define TS_MAX_PARAM_BYTES (64 * 1024)

typedef struct ts_config {
    deft_device dev;
    int adamw;                 /* else SGD */
    double momentum;           /* SGD: 0 means 0.9; < 0 means none */
    int accumulate;            /* accumulate_steps (0: 1) */
    int ln_dropout;            /* layer norm, gelu and dropout instead of relu */
    double dropout;            /* with ln_dropout: 0 means 0.25; < 0 means no dropout node */
    int decay_groups;          /* deft_optimizer_decay_2d_only (AdamW) */
    int64_t hidden;            /* 0: 24 */
    deft_compile_options copts;
} ts_config;

typedef struct ts_net {
    ts_config c;
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_optimizer *opt;
    deft_program *p;
    float hx[TS_B * TS_IN];
    int32_t hy[TS_B];
} ts_net;

static const char *const ts_param_names[] = {"fc1.weight", "fc1.bias", "scale", "ln.weight", "ln.bias",
                                             "fc2.weight", "fc2.bias"};
#define TS_N_NAMES ((int)(sizeof ts_param_names / sizeof ts_param_names[0]))

static inline deft_tensor *ts_hidden_layer(ts_net *n, deft_tensor *h, int64_t hid) {
    if (!n->c.ln_dropout) return deft_relu(h);
    deft_tensor *w = deft_param(n->g, "ln.weight", DEFT_F32, 1, (int64_t[]){hid}, n->c.dev, DEFT_INIT_ONES);
    deft_tensor *b = deft_param(n->g, "ln.bias", DEFT_F32, 1, (int64_t[]){hid}, n->c.dev, DEFT_INIT_ZEROS);
    h = deft_gelu(deft_layer_norm(h, w, b, 1e-5));
    const double p = n->c.dropout == 0.0 ? 0.25 : n->c.dropout;
    return p > 0.0 ? deft_dropout(h, p, 77) : h;
}

static inline deft_optimizer *ts_optimizer(ts_net *n) {
    deft_step_options st = {.accumulate_steps = n->c.accumulate ? n->c.accumulate : 1};
    if (n->c.adamw) {
        deft_adamw_options aw = deft_adamw_defaults();
        aw.lr = 0.01;
        aw.weight_decay = 0.05;
        deft_optimizer *o = deft_adamw(n->g, &aw, &st);
        if (o && n->c.decay_groups) CHECK_OK(deft_optimizer_decay_2d_only(o));
        return o;
    }
    const double m = n->c.momentum == 0.0 ? 0.9 : n->c.momentum < 0.0 ? 0.0 : n->c.momentum;
    return deft_sgd(n->g, &(deft_sgd_options){.lr = 0.1, .momentum = m}, &st);
}

/* Builds and compiles the net; 0 (a failed check) when anything fails. */
static inline int ts_build(ts_net *n, const ts_config *c) {
    memset(n, 0, sizeof *n);
    n->c = *c;
    const int64_t hid = c->hidden ? c->hidden : 24;
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 2024);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){TS_B, TS_IN}, c->dev);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){TS_B}, c->dev);
    deft_tensor *scale = deft_param(n->g, "scale", DEFT_F32, 1, (int64_t[]){hid}, c->dev, DEFT_INIT_ONES);
    if (scale) CHECK_OK(deft_param_set_requires_grad(scale, 0));
    deft_tensor *h = deft_mul(deft_linear(n->x, hid, "fc1", NULL), scale);
    h = ts_hidden_layer(n, h, hid);
    n->loss = deft_set_name(deft_cross_entropy(deft_linear(h, TS_CLS, "fc2", NULL), n->y), "loss");
    CHECK_OK(deft_backward(n->loss));
    n->opt = ts_optimizer(n);
    n->step = deft_optimizer_step(n->opt);
    if (!n->step || deft_graph_error(n->g) != DEFT_OK) {
        CHECK_MSG(0, "building the net: %s", deft_graph_errmsg(n->g));
        return 0;
    }
    n->p = deft_compile(n->g, (deft_tensor *[]){n->loss, n->step}, 2, &n->c.copts);
    CHECK_MSG(n->p != NULL, "compile: %s", deft_errmsg());
    return n->p != NULL;
}

static inline void ts_free(ts_net *n) {
    deft_graph_free(n->g);
    memset(n, 0, sizeof *n);
}

/* Batch k, the same for every net; `gain` scales x (1e30 overflows f16 gradients: a skipped step). */
static inline void ts_make_batch(uint64_t k, float gain, float *x, int32_t *y) {
    uint64_t rng = 0x7ea1ull * 1000 + k;
    for (int i = 0; i < TS_B * TS_IN; i++) x[i] = (float)ref_unif(&rng, -1, 1) * gain;
    for (int r = 0; r < TS_B; r++) y[r] = (int32_t)(ref_next(&rng) % TS_CLS);
}

static inline float ts_run(ts_net *n) {
    float loss = NAN;
    deft_status s = deft_program_run(n->p);
    CHECK_MSG(s == DEFT_OK, "run: %s", deft_errmsg());
    if (s == DEFT_OK) CHECK_OK(deft_program_read(n->p, n->loss, &loss, sizeof loss));
    return loss;
}

/* Feeds batch k and runs one step: its loss. */
static inline float ts_step(ts_net *n, uint64_t k, float gain) {
    ts_make_batch(k, gain, n->hx, n->hy);
    CHECK_OK(deft_program_feed(n->p, n->x, n->hx, sizeof n->hx));
    CHECK_OK(deft_program_feed(n->p, n->y, n->hy, sizeof n->hy));
    return ts_run(n);
}

/* Every parameter's bytes, in ts_param_names order, into buf: the count written. */
static inline size_t ts_params(const ts_net *n, unsigned char *buf) {
    size_t at = 0;
    for (int i = 0; i < TS_N_NAMES; i++) {
        deft_tensor *t = deft_graph_find(n->g, ts_param_names[i]);
        if (!t) continue;
        const size_t b = deft_tensor_nbytes(t);
        if (at + b > TS_MAX_PARAM_BYTES) {
            CHECK_MSG(0, "the net's parameters pass %d bytes", TS_MAX_PARAM_BYTES);
            return at;
        }
        CHECK_OK(deft_param_get(t, buf + at, b));
        at += b;
    }
    return at;
}

/* Sets the frozen parameter to values a fresh net does not have, so that only a load can give them back. */
static inline void ts_set_scale(ts_net *n) {
    deft_tensor *t = deft_graph_find(n->g, "scale");
    const int64_t hid = n->c.hidden ? n->c.hidden : 24;
    float v[256];
    for (int64_t i = 0; i < hid && i < 256; i++) v[i] = 0.5f + 0.03125f * (float)i;
    CHECK_OK(deft_param_set(t, v, (size_t)hid * sizeof(float)));
}

static inline int ts_same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* What the optimizer says, compared between the net that never stopped and the resumed one. */
typedef struct ts_opt_view {
    double lr, scale;
    int64_t updates, skipped;
} ts_opt_view;

static inline ts_opt_view ts_view_of(const ts_net *n) {
    ts_opt_view v = {deft_optimizer_lr(n->opt), 0, deft_optimizer_updates(n->opt), 0};
    CHECK_OK(deft_optimizer_loss_scale(n->opt, &v.scale, &v.skipped));
    return v;
}

static inline int ts_same_view(ts_opt_view a, ts_opt_view b) {
    return a.lr == b.lr && a.scale == b.scale && a.updates == b.updates && a.skipped == b.skipped;
}

/* The run that saved its state and never stopped, as a resumed one must repeat it: the parameters at the save and
 * at the end (`bytes` each), the loss and the optimizer's view after each step, the graph replays before the save. */
#define TS_MAX_STEPS 32

typedef struct ts_record {
    unsigned char at_save[TS_MAX_PARAM_BYTES], final[TS_MAX_PARAM_BYTES];
    size_t bytes;
    float loss[TS_MAX_STEPS];
    ts_opt_view view[TS_MAX_STEPS];
    int64_t replays_at_save;
} ts_record;

/* Step s's gain: batch `overflow` scaled to overflow f16 (a skipped step). */
static inline float ts_gain(int s, int overflow) { return s == overflow ? 1e30f : 1.0f; }

/* Net a's run: k steps (the rate halved at step 2), a save to path, then on to n (at most TS_MAX_STEPS), into r. */
static inline void ts_run_saved(ts_net *a, const char *path, int k, int n, int overflow, ts_record *r) {
    ts_set_scale(a);
    for (int s = 0; s < n; s++) {
        if (s == 2) CHECK_OK(deft_optimizer_set_lr(a->opt, deft_optimizer_lr(a->opt) * 0.5));
        if (s == k) {
            r->replays_at_save = deft_program_graph_replays(a->p);
            CHECK_OK(deft_train_state_save(path, a->p, a->opt, NULL));
            ts_params(a, r->at_save);
        }
        r->loss[s] = ts_step(a, (uint64_t)s, ts_gain(s, overflow));
        r->view[s] = ts_view_of(a);
    }
    r->bytes = ts_params(a, r->final);
}

/* Net b, loaded from path (saved at step k of the run r to n), goes on as r did: the parameters and the optimizer of
 * the save, then each step's loss and optimizer view bit for bit, and the final parameters. */
static inline void ts_check_resumed(const char *label, ts_net *b, const char *path, int k, int n, int overflow,
                                    const ts_record *r) {
    static unsigned char got[TS_MAX_PARAM_BYTES];
    deft_status s = deft_train_state_load(path, b->p, b->opt, NULL);
    CHECK_MSG(s == DEFT_OK, "%s: load: %s", label, deft_errmsg());
    ts_params(b, got);
    CHECK_MSG(memcmp(got, r->at_save, r->bytes) == 0, "%s: the loaded parameters are not the saved ones", label);
    CHECK_MSG(ts_same_view(ts_view_of(b), r->view[k - 1]), "%s: the loaded optimizer is not the saved one", label);
    for (int st = k; st < n; st++) {
        const float lb = ts_step(b, (uint64_t)st, ts_gain(st, overflow));
        CHECK_MSG(ts_same_bits(r->loss[st], lb), "%s: step %d: loss %.9g resumed, %.9g uninterrupted", label, st, lb,
                  r->loss[st]);
        CHECK_MSG(ts_same_view(ts_view_of(b), r->view[st]), "%s: step %d: the optimizer's counters differ", label, st);
    }
    ts_params(b, got);
    CHECK_MSG(memcmp(got, r->final, r->bytes) == 0, "%s: the final parameters differ", label);
}

/* A dataset of TS_DS_N records the same for every test: 5 batches of 16 an epoch, 10 records dropped. */
#define TS_DS_N 90

typedef struct ts_dataset {
    float images[TS_DS_N * TS_IN];
    int32_t labels[TS_DS_N];
    deft_dataset d;
} ts_dataset;

static inline void ts_dataset_make(ts_dataset *s) {
    uint64_t rng = 99;
    for (int i = 0; i < TS_DS_N * TS_IN; i++) s->images[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < TS_DS_N; i++) s->labels[i] = (int32_t)(ref_next(&rng) % TS_CLS);
    s->d = (deft_dataset){.n = TS_DS_N, .features = TS_IN, .n_classes = TS_CLS, .images = s->images,
                          .labels = s->labels};
}

/* One step from the loader (the end of an epoch passed over): its loss, and which batch it was as epoch * 100 +
 * index. */
static inline float ts_loader_step(ts_net *n, deft_loader *l, int64_t *which) {
    deft_loader_batch bt;
    CHECK_OK(deft_loader_next(l, n->p, &bt));
    if (bt.end) CHECK_OK(deft_loader_next(l, n->p, &bt));
    *which = bt.epoch * 100 + bt.index;
    return ts_run(n);
}

#endif
