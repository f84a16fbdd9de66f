/* GPT-2 (the model nanoGPT and llm.c train) built from deft's public API, for examples/gpt2_train.c, the benchmark
 * and the reference test: learned token and position tables, pre-norm blocks (layer norm, causal self-attention,
 * residual add, layer norm, MLP with GELU's tanh form, residual add), a final layer norm and an LM head that reads the
 * token table transposed (tied weights). Parameter names follow GPT-2's checkpoints: wte, wpe, h<i>.ln_1.weight,
 * h<i>.attn.c_attn.weight, ..., ln_f.bias. Linear weights are [in, out], as deft_linear keeps them. */
#ifndef DEFT_EXAMPLE_GPT2_H
#define DEFT_EXAMPLE_GPT2_H

#include <math.h>
#include <stdio.h>

#include "deft.h"

typedef struct gpt2_config {
    int64_t vocab, seq, width, layers, heads;
} gpt2_config;

/* GPT-2 small: 124M parameters (the vocabulary padded to 50304, as llm.c and nanoGPT pad it). */
static inline gpt2_config gpt2_124m(void) { return (gpt2_config){50304, 1024, 768, 12, 12}; }

typedef struct gpt2 {
    gpt2_config c;
    int64_t batch;
    deft_graph *g;
    deft_tensor *x, *y;        /* inputs: i32 [batch, seq] tokens and their next tokens */
    deft_tensor *logits;       /* [batch, seq, vocab] */
    deft_tensor *loss;         /* mean cross-entropy of y under logits */
    deft_tensor *wte, *wpe;
    deft_tensor *block_out[64];   /* each block's output (checkpoint spans) */
    int shapes_only;              /* gpt2_build_shapes_into: the normal draws are left out */
    int64_t loss_chunks;          /* the loss's row blocks (gpt2_build_options) */
} gpt2;

/* How the model is built (zeros: as GPT-2 trains). shapes_only: the parameters are not drawn (a graph that is only
 * planned). loss_chunks K > 1: the loss is taken over K blocks of rows of the final hidden state, each block's logits
 * made by its own product and read by its own cross-entropy (their sums added, then divided by the rows): the same
 * loss up to the order of the sum, and a checkpoint budget can then drop and recompute one block's logits at a time
 * instead of holding all [B T, V] of them at the loss, which is what held GPT-2's checkpointing floor. */
typedef struct gpt2_build_options {
    int shapes_only;
    int64_t loss_chunks;
} gpt2_build_options;

/* param ~ N(0, std), unless the model is built for its shapes alone: a graph that is only planned (deft_largest_batch's
 * probes) needs no values, and drawing GPT-2 124M's on the host took most of each probe's time. */
static inline deft_status gpt2_init_normal(const gpt2 *m, deft_tensor *param, double std) {
    return m->shapes_only ? DEFT_OK : deft_param_init_normal(param, 0.0, std, 0);
}

/* A 1-D parameter of `width` set to `value`: layer norms' weights (1) and biases (0). */
static inline deft_tensor *gpt2_vector(deft_graph *g, const char *name, int64_t width, deft_device dev,
                                       deft_init init) {
    return deft_param(g, name, DEFT_F32, 1, (int64_t[]){width}, dev, init);
}

/* y = x @ W + b with W ~ N(0, std) and b = 0, as GPT-2 starts them. */
static inline deft_tensor *gpt2_linear(const gpt2 *m, deft_tensor *x, int64_t out, const char *name, double std) {
    const deft_linear_options lo = {.weight_init = DEFT_INIT_ZEROS, .zero_bias = 1};
    deft_tensor *y = deft_linear(x, out, name, &lo);
    if (!y) return NULL;
    char w[96];
    snprintf(w, sizeof w, "%s.weight", name);
    return gpt2_init_normal(m, deft_graph_find(m->g, w), std) == DEFT_OK ? y : NULL;
}

static inline deft_tensor *gpt2_layer_norm(const gpt2 *m, deft_tensor *x, const char *prefix, deft_device dev) {
    const int64_t width = m->c.width;
    char w[96], b[96];
    snprintf(w, sizeof w, "%s.weight", prefix);
    snprintf(b, sizeof b, "%s.bias", prefix);
    deft_graph *g = m->g;
    return deft_layer_norm(x, gpt2_vector(g, w, width, dev, DEFT_INIT_ONES), gpt2_vector(g, b, width, dev,
                           DEFT_INIT_ZEROS), 1e-5);
}

/* [B, T, C] -> [B, H, T, D] */
static inline deft_tensor *gpt2_heads(deft_tensor *t, const gpt2 *m) {
    const int64_t d = m->c.width / m->c.heads;
    t = deft_reshape(t, 4, (int64_t[]){m->batch, m->c.seq, m->c.heads, d});
    return deft_permute(t, (int[]){0, 2, 1, 3});
}

/* Nonzero: gpt2_attention builds the composition the packed op replaced (q, k and v sliced out of c_attn's product
 * and permuted to [B, H, T, D], the output permuted back): the same math, for tests/test_gpt2_attention_bytes.c to
 * measure what the packed op saves. An expression, read at each build. */
#ifndef GPT2_ATTENTION_APART
#define GPT2_ATTENTION_APART 0
#endif

/* Causal self-attention read straight out of c_attn's [B, T, 3C] product and written as [B, T, H, D] = [B, T, C]:
 * no copy of q, k, v or the output, and the backward writes c_attn's output gradient in place (llm.c and torch's
 * cuDNN SDPA read the same strides). */
static inline deft_tensor *gpt2_attention(deft_tensor *a, const gpt2 *m, const char *prefix, double proj_std) {
    const int64_t c = m->c.width;
    char name[64];   /* the prefix comes from gpt2_block's 48 bytes */
    snprintf(name, sizeof name, "%s.c_attn", prefix);
    deft_tensor *qkv = gpt2_linear(m, a, 3 * c, name, 0.02);
    const deft_attention_options ao = {.causal = 1};
    deft_tensor *y;
    if (GPT2_ATTENTION_APART) {
        deft_tensor *q = gpt2_heads(deft_slice(qkv, 2, 0, c, 1), m);
        deft_tensor *k = gpt2_heads(deft_slice(qkv, 2, c, 2 * c, 1), m);
        deft_tensor *v = gpt2_heads(deft_slice(qkv, 2, 2 * c, 3 * c, 1), m);
        y = deft_permute(deft_attention(q, k, v, &ao), (int[]){0, 2, 1, 3});
        y = deft_reshape(y, 3, (int64_t[]){m->batch, m->c.seq, c});
    } else {
        y = deft_attention_packed(qkv, (int)m->c.heads, &ao);
    }
    snprintf(name, sizeof name, "%s.c_proj", prefix);
    return gpt2_linear(m, y, c, name, proj_std);
}

static inline deft_tensor *gpt2_block(deft_tensor *h, const gpt2 *m, int i, deft_device dev) {
    const int64_t c = m->c.width;
    const double proj_std = 0.02 / sqrt(2.0 * (double)m->c.layers);
    char p[48], q[48];
    snprintf(p, sizeof p, "h%d.ln_1", i);
    snprintf(q, sizeof q, "h%d.attn", i);
    h = deft_add(h, gpt2_attention(gpt2_layer_norm(m, h, p, dev), m, q, proj_std));
    snprintf(p, sizeof p, "h%d.ln_2", i);
    deft_tensor *f = gpt2_layer_norm(m, h, p, dev);
    snprintf(q, sizeof q, "h%d.mlp.c_fc", i);
    f = deft_gelu_tanh(gpt2_linear(m, f, 4 * c, q, 0.02));
    snprintf(q, sizeof q, "h%d.mlp.c_proj", i);
    return deft_add(h, gpt2_linear(m, f, c, q, proj_std));
}

/* The mean cross-entropy of y under the logits of h [B, T, C] in m->loss_chunks blocks of rows (gpt2_build_options). */
static inline deft_tensor *gpt2_chunked_loss(const gpt2 *m, deft_tensor *h) {
    const int64_t n = m->batch * m->c.seq, rows = n / m->loss_chunks;
    deft_tensor *hf = deft_reshape(h, 2, (int64_t[]){n, m->c.width});
    deft_tensor *t = deft_reshape(m->y, 1, (int64_t[]){n});
    deft_cross_entropy_options o = deft_cross_entropy_defaults();
    o.reduction = DEFT_REDUCTION_SUM;
    deft_tensor *sum = NULL;
    for (int64_t k = 0; k < m->loss_chunks; k++) {
        deft_tensor *hk = deft_slice(hf, 0, k * rows, (k + 1) * rows, 1);
        deft_tensor *part = deft_cross_entropy_ex(deft_matmul_t(hk, m->wte, 0, 1), deft_slice(t, 0, k * rows,
                                                                                               (k + 1) * rows, 1), &o);
        sum = sum ? deft_add(sum, part) : part;
    }
    return deft_mul_scalar(sum, 1.0 / (double)n);
}

/* Builds the model into g (deft_largest_batch hands its builder a graph) for batches of `batch` sequences on `dev`,
 * its parameters drawn from g's seed, as `o` says (NULL: the defaults). A size the model cannot take (layers outside
 * [1, 64], heads not dividing the width, loss_chunks negative or not dividing B T) is DEFT_ERR_INVALID; otherwise a failure's
 * status is the graph's error, which says why. */
static inline deft_status gpt2_build_with(gpt2 *m, deft_graph *g, const gpt2_config *c, int64_t batch,
                                          deft_device dev, const gpt2_build_options *o) {
    const int64_t chunks = o && o->loss_chunks > 1 ? o->loss_chunks : 1;
    *m = (gpt2){.c = *c, .batch = batch, .g = g, .shapes_only = o && o->shapes_only, .loss_chunks = chunks};
    if (c->layers < 1 || c->layers > 64 || c->heads < 1 || c->width % c->heads != 0) return DEFT_ERR_INVALID;
    if (batch < 1 || c->seq < 1 || (o && o->loss_chunks < 0) || (batch * c->seq) % chunks != 0)
        return DEFT_ERR_INVALID;
    const int64_t bt[2] = {batch, c->seq};
    m->x = deft_input(g, "x", DEFT_I32, 2, bt, dev);
    m->y = deft_input(g, "y", DEFT_I32, 2, bt, dev);
    m->wte = deft_param(g, "wte", DEFT_F32, 2, (int64_t[]){c->vocab, c->width}, dev, DEFT_INIT_ZEROS);
    m->wpe = deft_param(g, "wpe", DEFT_F32, 2, (int64_t[]){c->seq, c->width}, dev, DEFT_INIT_ZEROS);
    if (!m->wte || !m->wpe) return deft_graph_error(g);
    deft_status s = gpt2_init_normal(m, m->wte, 0.02);
    if (s == DEFT_OK) s = gpt2_init_normal(m, m->wpe, 0.02);
    if (s != DEFT_OK) return s;
    deft_tensor *pos = deft_arange(g, DEFT_I32, 0, (double)c->seq, 1, dev);
    deft_tensor *h = deft_add(deft_embedding(m->wte, m->x), deft_embedding(m->wpe, pos));
    for (int i = 0; i < (int)c->layers; i++) m->block_out[i] = h = gpt2_block(h, m, i, dev);
    h = gpt2_layer_norm(m, h, "ln_f", dev);
    /* The whole logits are built either way (evaluation and sampling read them); with loss chunks the training
     * step's loss does not read them, so it never computes them. */
    m->logits = deft_set_name(deft_matmul_t(h, m->wte, 0, 1), "logits");
    if (chunks > 1) {
        m->loss = deft_set_name(gpt2_chunked_loss(m, h), "loss");
        return m->loss ? DEFT_OK : deft_graph_error(g);
    }
    deft_tensor *flat = deft_reshape(m->logits, 2, (int64_t[]){batch * c->seq, c->vocab});
    deft_tensor *targets = deft_reshape(m->y, 1, (int64_t[]){batch * c->seq});
    m->loss = deft_set_name(deft_cross_entropy(flat, targets), "loss");
    return m->loss ? DEFT_OK : deft_graph_error(g);
}

static inline deft_status gpt2_build_into(gpt2 *m, deft_graph *g, const gpt2_config *c, int64_t batch,
                                          deft_device dev) {
    return gpt2_build_with(m, g, c, batch, dev, NULL);
}

/* The same graph, node for node, with the parameters left at their creation values (no normal draws): for a graph
 * that is planned and never run. */
static inline deft_status gpt2_build_shapes_into(gpt2 *m, deft_graph *g, const gpt2_config *c, int64_t batch,
                                                 deft_device dev) {
    return gpt2_build_with(m, g, c, batch, dev, &(gpt2_build_options){.shapes_only = 1});
}

/* gpt2_build_into a new graph seeded with `seed`. On failure m->g holds the graph (its error says why). */
static inline deft_status gpt2_build(gpt2 *m, const gpt2_config *c, int64_t batch, deft_device dev, uint64_t seed) {
    deft_graph *g = deft_graph_new();
    if (!g) return DEFT_ERR_OOM;
    deft_graph_set_seed(g, seed);
    return gpt2_build_into(m, g, c, batch, dev);
}

/* The number of parameters. */
static inline int64_t gpt2_param_count(const gpt2_config *c) {
    const int64_t w = c->width;
    return c->vocab * w + c->seq * w + c->layers * (12 * w * w + 13 * w) + 2 * w;
}

#endif
