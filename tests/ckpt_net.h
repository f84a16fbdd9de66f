/* Random layered nets for the checkpointing tests: depth, widths, activations and dropout drawn from a seed, a
 * cross-entropy loss, and its gradients (and optionally an SGD step). Two builds from one spec are the same net with
 * the same parameters, so a run with checkpointing can be compared with one without, bit for bit. */
#ifndef DEFT_TEST_CKPT_NET_H
#define DEFT_TEST_CKPT_NET_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "xorshift.h"

#define CK_MAX_LAYERS 40
#define CK_CLASSES 5

typedef struct ck_spec {
    int depth, batch, in;
    int width[CK_MAX_LAYERS];
    int act[CK_MAX_LAYERS];      /* 0 relu, 1 tanh, 2 gelu, 3 sigmoid */
    double dropout[CK_MAX_LAYERS];
    int sgd;                     /* 1: an SGD step node besides the loss and gradients */
    uint64_t seed;
} ck_spec;

typedef struct ck_net {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_tensor *pre[CK_MAX_LAYERS], *act[CK_MAX_LAYERS];   /* each layer's linear output and activation */
    deft_tensor *outs[2 * CK_MAX_LAYERS + 4];
    int n_outs;
    float *xs;
    int32_t *ys;
} ck_net;

/* The plan table of p as text (malloc'd), as deft_program_print_plan writes it. */
static inline char *ck_plan_text(const deft_program *p) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    CHECK_OK(deft_program_print_plan(p, f));
    long n = ftell(f);
    char *text = calloc((size_t)n + 1, 1);
    rewind(f);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = '\0';
    fclose(f);
    return text;
}

static inline void ck_spec_random(ck_spec *s, uint64_t seed, int with_dropout) {
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->depth = 2 + xorshift64_below(&r, 6);
    s->batch = 16 + xorshift64_below(&r, 48);
    s->in = 3 + xorshift64_below(&r, 12);
    for (int l = 0; l < s->depth; l++) {
        s->width[l] = 2 + xorshift64_below(&r, 30);
        s->act[l] = xorshift64_below(&r, 4);
        s->dropout[l] = with_dropout && xorshift64_below(&r, 2) ? 0.25 : 0.0;
    }
    s->sgd = xorshift64_below(&r, 2);
}

static inline deft_tensor *ck_activation(deft_tensor *t, int act) {
    switch (act) {
    case 1: return deft_tanh(t);
    case 2: return deft_gelu(t);
    case 3: return deft_sigmoid(t);
    default: return deft_relu(t);
    }
}

/* Builds the net on dev; the outputs are the loss, every parameter's gradient, and the step when s->sgd. */
static inline int ck_build(ck_net *n, const ck_spec *s, deft_device dev) {
    memset(n, 0, sizeof *n);
    n->g = deft_graph_new();
    deft_graph_set_seed(n->g, 1000 + s->seed);
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){s->batch, s->in}, dev);
    n->y = deft_input(n->g, "y", DEFT_I32, 1, (int64_t[]){s->batch}, dev);
    deft_tensor *h = n->x;
    for (int l = 0; l < s->depth; l++) {
        char name[32];
        snprintf(name, sizeof name, "l%d", l);
        n->pre[l] = deft_linear(h, s->width[l], name, NULL);
        snprintf(name, sizeof name, "l%d.pre", l);
        deft_set_name(n->pre[l], name);
        h = ck_activation(n->pre[l], s->act[l]);
        if (s->dropout[l] > 0) h = deft_dropout(h, s->dropout[l], 77 + (uint64_t)l);
        snprintf(name, sizeof name, "l%d.act", l);
        n->act[l] = deft_set_name(h, name);
    }
    n->loss = deft_set_name(deft_cross_entropy(deft_linear(h, CK_CLASSES, "head", NULL), n->y), "loss");
    CHECK_MSG(n->loss != NULL, "building the net failed: %s", deft_errmsg());
    if (!n->loss) return 0;
    CHECK_OK(deft_backward(n->loss));
    n->outs[n->n_outs++] = n->loss;
    for (int l = 0; l <= s->depth; l++) {
        char name[32];
        snprintf(name, sizeof name, l < s->depth ? "l%d.weight" : "head.weight", l);
        n->outs[n->n_outs++] = deft_grad(deft_graph_find(n->g, name));
        snprintf(name, sizeof name, l < s->depth ? "l%d.bias" : "head.bias", l);
        n->outs[n->n_outs++] = deft_grad(deft_graph_find(n->g, name));
    }
    if (s->sgd) {
        deft_optimizer *o = deft_sgd(n->g, &(deft_sgd_options){.lr = 0.1, .momentum = 0.9}, NULL);
        n->step = deft_optimizer_step(o);
        n->outs[n->n_outs++] = n->step;
    }
    for (int i = 0; i < n->n_outs; i++) CHECK(n->outs[i] != NULL);
    n->xs = malloc((size_t)s->batch * (size_t)s->in * sizeof *n->xs);
    n->ys = malloc((size_t)s->batch * sizeof *n->ys);
    uint64_t r = s->seed + 17;
    for (int i = 0; i < s->batch * s->in; i++) n->xs[i] = (float)xorshift64_below(&r, 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < s->batch; i++) n->ys[i] = xorshift64_below(&r, CK_CLASSES);
    return 1;
}

static inline void ck_free(ck_net *n) {
    deft_graph_free(n->g);
    free(n->xs);
    free(n->ys);
}

/* Every output's bytes after `runs` runs, one after the other, into *out (malloc'd). */
static inline size_t ck_run(ck_net *n, deft_program *p, int runs, unsigned char **out) {
    size_t total = 0;
    for (int i = 0; i < n->n_outs; i++) total += deft_tensor_nbytes(n->outs[i]);
    unsigned char *buf = malloc(total * (size_t)runs), *at = buf;
    for (int r = 0; r < runs; r++) {
        CHECK_OK(deft_program_feed(p, n->x, n->xs, deft_tensor_nbytes(n->x)));
        CHECK_OK(deft_program_feed(p, n->y, n->ys, deft_tensor_nbytes(n->y)));
        CHECK_OK(deft_program_run(p));
        for (int i = 0; i < n->n_outs; i++) {
            CHECK_OK(deft_program_read(p, n->outs[i], at, deft_tensor_nbytes(n->outs[i])));
            at += deft_tensor_nbytes(n->outs[i]);
        }
    }
    *out = buf;
    return total * (size_t)runs;
}

/* The smallest budget DEFT_CHECKPOINT_BUDGET meets, read from the message of a budget of 1 byte. */
static inline size_t ck_smallest_budget(ck_net *n) {
    deft_program *p = deft_compile(
        n->g, n->outs, n->n_outs,
        &(deft_compile_options){.memory_budget = 1, .checkpoint = DEFT_CHECKPOINT_BUDGET, .no_cheap_recompute = 1});
    CHECK(p == NULL);
    const char *m = strstr(deft_errmsg(), "fits is ");
    CHECK_MSG(m != NULL, "no smallest budget in \"%s\"", deft_errmsg());
    return m ? (size_t)strtoull(m + 8, NULL, 10) : 0;
}

#endif
