/* Fusion on a GPU: chains of elementwise nodes (f32, bf16, f16, casts between them) run as one kernel and store
 * exactly what the one-op kernels store; matmuls with a bias (and ReLU) or a bias gradient run as one cuBLASLt call,
 * linear layers on 3-d and 4-d activations (f32 and bf16 autocast) included, within the unfused program's tolerance;
 * a fused program trains like the same program compiled with no_fusion, and the DOT dump shows what was fused. */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "deft_testing.h"
#include "ref.h"

#define GPU deft_cuda(0)
#define ROWS 37
#define COLS 29

/* The compile option fuse_low_precision for the fused programs: bf16 and f16 chains fuse only when asked
 * (passes/fusion.c); main turns it on once the f32 chains ran without it. */
static int fuse_low_precision;

/* ---- random elementwise chains: fused and unfused outputs equal bit for bit ---- */
typedef struct chain {
    deft_graph *g;
    deft_dtype dt;
    deft_tensor *in[3];
    deft_tensor *outs[4];
    int n_outs;
} chain;

static deft_tensor *chain_op(deft_tensor *x, deft_tensor *y, uint64_t *rng) {
    switch (ref_next(rng) % 14) {
    case 0: return deft_add(x, y);
    case 1: return deft_sub(x, y);
    case 2: return deft_mul(x, y);
    case 3: return deft_maximum(x, y);
    case 4: return deft_mul_scalar(x, ref_unif(rng, -2, 2));
    case 5: return deft_add_scalar(x, ref_unif(rng, -1, 1));
    case 6: return deft_tanh(x);
    case 7: return deft_sigmoid(x);
    case 8: return deft_relu(x);
    case 9: return deft_gelu(x);
    case 10: return deft_silu(x);
    case 11: return deft_neg(x);
    case 12: return deft_gt(x, y);
    default: return deft_div(x, deft_add_scalar(deft_mul(y, y), 1.0));
    }
}

/* Inputs [R, C], [C] and [R, 1] (broadcast), a chain of n ops over them, some members read outside the chain. */
static void chain_build(chain *c, uint64_t seed, int n, deft_dtype dt) {
    uint64_t rng = seed;
    c->g = deft_graph_new();
    c->dt = dt;
    c->in[0] = deft_input(c->g, "a", dt, 2, (int64_t[]){ROWS, COLS}, GPU);
    c->in[1] = deft_input(c->g, "b", dt, 1, (int64_t[]){COLS}, GPU);
    c->in[2] = deft_input(c->g, "c", dt, 2, (int64_t[]){ROWS, 1}, GPU);
    deft_tensor *vals[64] = {c->in[0], deft_mul(c->in[0], c->in[1]), c->in[2]};
    int nv = 3;
    c->n_outs = 0;
    for (int i = 0; i < n; i++) {
        deft_tensor *x = vals[nv - 1 - (int)(ref_next(&rng) % (uint64_t)(nv < 3 ? nv : 3))];
        deft_tensor *y = vals[ref_next(&rng) % (uint64_t)nv];
        if (x == c->in[2]) x = deft_add(x, vals[0]);   /* keep the chain at [R, C] */
        vals[nv++] = chain_op(x, y, &rng);
        if (c->n_outs < 2 && ref_next(&rng) % 5 == 0) c->outs[c->n_outs++] = vals[nv - 1];
    }
    /* A member read by a reduction and through a reshape (a view), and the last value. */
    c->outs[c->n_outs++] = deft_sum(deft_reshape(vals[nv / 2 + 1], 1, (int64_t[]){ROWS * COLS}), 0, NULL, 0);
    c->outs[c->n_outs++] = vals[nv - 1];
    CHECK_MSG(deft_graph_error(c->g) == DEFT_OK, "%s", deft_graph_errmsg(c->g));
}

/* host[i] holds input i in the chain's dtype; out receives every output's bytes, one after the other. */
static void chain_run(chain *c, deft_program *p, const void *const *host, char *out, size_t out_bytes) {
    const size_t sizes[3] = {ROWS * COLS, COLS, ROWS};
    for (int i = 0; i < 3; i++) CHECK_OK(deft_program_feed(p, c->in[i], host[i], sizes[i] * deft_dtype_size(c->dt)));
    CHECK_OK(deft_program_run(p));
    size_t at = 0;
    for (int o = 0; o < c->n_outs; o++) {
        size_t bytes = deft_tensor_nbytes(c->outs[o]);
        CHECK(at + bytes <= out_bytes);
        if (at + bytes > out_bytes) return;
        CHECK_OK(deft_program_read(p, c->outs[o], out + at, bytes));
        at += bytes;
    }
}

static void test_random_chains(deft_dtype dt) {
    static float a[ROWS * COLS], b[COLS], cc[ROWS];
    static char fused[4 * ROWS * COLS * sizeof(float) + 8], plain[sizeof fused];
    int fewer = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t rng = seed * 7919;
        for (int i = 0; i < ROWS * COLS; i++) a[i] = (float)ref_unif(&rng, -3, 3);
        for (int i = 0; i < COLS; i++) b[i] = (float)ref_unif(&rng, -3, 3);
        for (int i = 0; i < ROWS; i++) cc[i] = (float)ref_unif(&rng, -3, 3);
        /* room for any dtype ref_store writes: the compiler cannot tell that dt is never f64 here */
        static char ha[ROWS * COLS * sizeof(double)], hb[COLS * sizeof(double)], hc[ROWS * sizeof(double)];
        for (int i = 0; i < ROWS * COLS; i++) ref_store(ha, dt, i, a[i]);
        for (int i = 0; i < COLS; i++) ref_store(hb, dt, i, b[i]);
        for (int i = 0; i < ROWS; i++) ref_store(hc, dt, i, cc[i]);
        const void *host[3] = {ha, hb, hc};
        chain c;
        chain_build(&c, seed, 3 + (int)(seed % 20), dt);
        deft_program *pf =
            deft_compile(c.g, c.outs, c.n_outs, &(deft_compile_options){.fuse_low_precision = fuse_low_precision});
        deft_program *pu = deft_compile(c.g, c.outs, c.n_outs, &(deft_compile_options){.no_fusion = 1});
        CHECK_MSG(pf && pu, "compile: %s", deft_errmsg());
        if (pf && pu) {
            memset(fused, 0xff, sizeof fused);
            memset(plain, 0x7f, sizeof plain);
            for (int run = 0; run < 4; run++) {   /* eager, eager, capture, replay */
                chain_run(&c, pf, host, fused, sizeof fused);
                chain_run(&c, pu, host, plain, sizeof plain);
                size_t n = 0;
                for (int o = 0; o < c.n_outs; o++) n += deft_tensor_nbytes(c.outs[o]);
                CHECK_MSG(memcmp(fused, plain, n) == 0, "%s seed %llu run %d: fused != unfused", deft_dtype_name(dt),
                          (unsigned long long)seed, run);
            }
            fewer += deft_program_step_count(pf) < deft_program_step_count(pu);
        }
        deft_graph_free(c.g);
    }
    CHECK_MSG(fewer >= 30, "%s: only %d of 40 chains ran fewer kernels fused", deft_dtype_name(dt), fewer);
}

/* ---- a chain ending in a sum or mean over every element (a loss): one kernel, the unfused value bit for bit ---- */
static void test_chain_reduction(int mean, int64_t rows, int64_t cols, int want_steps) {
    deft_graph *g = deft_graph_new();
    const int64_t shape[2] = {rows, cols};
    deft_tensor *a = deft_input(g, "a", DEFT_F32, 2, shape, GPU), *b = deft_input(g, "b", DEFT_F32, 2, shape, GPU);
    deft_tensor *d = deft_sub(a, b), *sq = deft_mul_scalar(deft_mul(d, d), 0.5);
    deft_tensor *r = mean ? deft_mean(sq, 0, NULL, 0) : deft_sum(sq, 0, NULL, 0);
    deft_tensor *outs[2] = {r, d};   /* d is read outside the chain: stored beside the reduction */
    const size_t n = (size_t)(rows * cols);
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb), *df = malloc(n * sizeof *df),
          *dp = malloc(n * sizeof *dp);
    CHECK(ha && hb && df && dp);
    uint64_t rng = (uint64_t)(rows * 131 + cols + mean);
    for (size_t i = 0; i < n; i++) {
        ha[i] = (float)ref_unif(&rng, -2, 2);
        hb[i] = (float)ref_unif(&rng, -2, 2);
    }
    deft_program *pf = deft_compile(g, outs, 2, &(deft_compile_options){.fuse_low_precision = fuse_low_precision});
    deft_program *pu = deft_compile(g, outs, 2, &(deft_compile_options){.no_fusion = 1});
    CHECK_MSG(pf && pu, "compile: %s", deft_errmsg());
    if (pf && pu) {
        CHECK_MSG(deft_program_step_count(pf) == want_steps, "%lldx%lld %s: %d fused steps, want %d",
                  (long long)rows, (long long)cols, mean ? "mean" : "sum", deft_program_step_count(pf), want_steps);
        double ref = 0;
        for (size_t i = 0; i < n; i++) ref += 0.5 * ((double)ha[i] - hb[i]) * ((double)ha[i] - hb[i]);
        if (mean) ref /= (double)n;
        for (int run = 0; run < 4; run++) {   /* eager, eager, capture, replay */
            float rf = -1, rp = -2;
            deft_program *ps[2] = {pf, pu};
            for (int k = 0; k < 2; k++) {
                CHECK_OK(deft_program_feed(ps[k], a, ha, n * sizeof *ha));
                CHECK_OK(deft_program_feed(ps[k], b, hb, n * sizeof *hb));
                CHECK_OK(deft_program_run(ps[k]));
                CHECK_OK(deft_program_read(ps[k], r, k ? &rp : &rf, sizeof rf));
                CHECK_OK(deft_program_read(ps[k], d, k ? dp : df, n * sizeof *df));
            }
            CHECK_MSG(memcmp(&rf, &rp, sizeof rf) == 0, "run %d: reduction %.9g fused, %.9g not", run, rf, rp);
            CHECK_MSG(memcmp(df, dp, n * sizeof *df) == 0, "run %d: the stored member differs", run);
            CHECK_MSG(fabs(rf - ref) <= 1e-5 * fabs(ref), "run %d: %.9g, reference %.9g", run, rf, ref);
        }
    }
    deft_graph_free(g);
    free(ha);
    free(hb);
    free(df);
    free(dp);
}

/* ---- an MLP: fused (bias+ReLU epilogues, bias gradients, elementwise chains) trains as the unfused program ---- */
typedef struct mlp {
    deft_graph *g;
    deft_tensor *x, *y, *loss, *step;
    deft_program *p;
} mlp;

static void mlp_build(mlp *m, int mse, int fusion, int tf32) {
    m->g = deft_graph_new();
    deft_graph_set_seed(m->g, 11);
    m->x = deft_input(m->g, "x", DEFT_F32, 2, (int64_t[]){64, 48}, GPU);
    m->y = mse ? deft_input(m->g, "y", DEFT_F32, 2, (int64_t[]){64, 3}, GPU)
               : deft_input(m->g, "y", DEFT_I32, 1, (int64_t[]){64}, GPU);
    deft_tensor *h = deft_relu(deft_linear(m->x, 96, "fc1", NULL));
    h = deft_relu(deft_linear(h, 64, "fc2", NULL));
    h = deft_linear(h, mse ? 3 : 10, "fc3", NULL);
    m->loss = mse ? deft_mse_loss(h, m->y) : deft_cross_entropy(h, m->y);
    CHECK_OK(deft_backward(m->loss));
    deft_optimizer *opt = deft_sgd(m->g, &(deft_sgd_options){.lr = 0.05, .momentum = 0.9}, NULL);
    m->step = deft_optimizer_step(opt);
    m->p = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step}, 2,
                        &(deft_compile_options){.no_fusion = !fusion, .tf32 = tf32,
                                                .fuse_low_precision = fuse_low_precision});
    CHECK_MSG(m->p != NULL, "compile: %s", deft_errmsg());
}

static void mlp_train(mlp *m, int mse, float *losses, int steps) {
    uint64_t rng = 99;
    float x[64 * 48], y[64 * 3];
    int32_t labels[64];
    for (int i = 0; i < 64 * 48; i++) x[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < 64 * 3; i++) y[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < 64; i++) labels[i] = (int32_t)(ref_next(&rng) % 10);
    for (int s = 0; s < steps; s++) {   /* one batch, learnt step after step */
        CHECK_OK(deft_program_feed(m->p, m->x, x, sizeof x));
        CHECK_OK(mse ? deft_program_feed(m->p, m->y, y, sizeof y) : deft_program_feed(m->p, m->y, labels, sizeof labels));
        CHECK_OK(deft_program_run(m->p));
        CHECK_OK(deft_program_read(m->p, m->loss, &losses[s], sizeof losses[s]));
    }
}

static int file_contains(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

static void test_mlp(int mse, int tf32, double tol) {
    mlp fused, plain;
    mlp_build(&fused, mse, 1, tf32);
    mlp_build(&plain, mse, 0, tf32);
    if (!fused.p || !plain.p) return;
    CHECK_MSG(deft_program_step_count(fused.p) < deft_program_step_count(plain.p), "%d fused steps vs %d",
              deft_program_step_count(fused.p), deft_program_step_count(plain.p));
    float lf[12], lp[12];
    mlp_train(&fused, mse, lf, 12);
    mlp_train(&plain, mse, lp, 12);
    for (int s = 0; s < 12; s++)
        CHECK_MSG(fabs(lf[s] - lp[s]) <= tol * fabs(lp[s]) + 1e-7, "mse %d tf32 %d step %d: loss %.9g fused, %.9g not",
                  mse, tf32, s, lf[s], lp[s]);
    CHECK_MSG(lf[11] < lf[0], "fused training did not lower the loss: %g -> %g", lf[0], lf[11]);
    float wf[48 * 96], wp[48 * 96];
    CHECK_OK(deft_param_get(deft_graph_find(fused.g, "fc1.weight"), wf, sizeof wf));
    CHECK_OK(deft_param_get(deft_graph_find(plain.g, "fc1.weight"), wp, sizeof wp));
    double num = 0, den = 0;
    for (int i = 0; i < 48 * 96; i++) {
        num += (double)(wf[i] - wp[i]) * (wf[i] - wp[i]);
        den += (double)wp[i] * wp[i];
    }
    CHECK_MSG(sqrt(num / den) <= tol, "weights differ by %g (relative)", sqrt(num / den));
    CHECK_OK(deft_graph_dump_dot(fused.g, fused.p, "cuda_test_fusion.dot"));
    CHECK(file_contains("cuda_test_fusion.dot", "fused kernel"));
    deft_graph_free(fused.g);
    deft_graph_free(plain.g);
}

/* ---- linear layers on [B, T, C] and [B, H, T, C] (GPT-2's): the product over the stacked rows with the bias (and
 * ReLU) as its epilogue, and the weight gradient, which reads dy flattened, with dy's sum over every axis but the last
 * (the bias gradient) as its BGRADA epilogue; against the program compiled with no_fusion ---- */
typedef struct nd_linear {
    deft_graph *g;
    deft_tensor *outs[4];   /* y, and the gradients of the weight, the bias and x */
    deft_program *p;
} nd_linear;

static void nd_linear_build(nd_linear *l, int nd, const int64_t *xs, int64_t n, int relu, deft_dtype autocast,
                            int fusion) {
    l->g = deft_graph_new();
    deft_graph_set_seed(l->g, 23);
    deft_tensor *x = deft_param(l->g, "x", DEFT_F32, nd, xs, GPU, DEFT_INIT_XAVIER);
    deft_tensor *y = deft_linear(x, n, "fc", NULL);
    if (relu) y = deft_relu(y);
    CHECK_OK(deft_backward(deft_sum(deft_mul(y, y), 0, NULL, 0)));
    deft_tensor *outs[4] = {y, deft_grad(deft_graph_find(l->g, "fc.weight")), deft_grad(deft_graph_find(l->g, "fc.bias")),
                            deft_grad(x)};
    memcpy(l->outs, outs, sizeof outs);
    l->p = deft_compile(l->g, l->outs, 4, &(deft_compile_options){.no_fusion = !fusion, .autocast = autocast});
    CHECK_MSG(l->p != NULL, "compile: %s", deft_errmsg());
}

/* The nodes of op `op` that run in a matmul group of p (autocast's counterparts included). */
static int nd_in_matmul_groups(const nd_linear *l, const char *op) {
    int n = 0;
    for (int id = 0; id < deft_graph_node_count(l->g); id++) {
        const deft_tensor *t = deft_testing_node(l->g, id);
        deft_testing_node_plan np;
        deft_testing_program_node_plan(l->p, t, &np);
        n += np.group_kind && strcmp(np.group_kind, "matmul") == 0 && deft_testing_is_op(t, op);
    }
    return n;
}

static float *nd_read(const nd_linear *l, int i) {
    const size_t bytes = deft_tensor_nbytes(l->outs[i]);
    float *v = calloc(1, bytes + sizeof(float));
    CHECK_OK(deft_program_read(l->p, l->outs[i], v, bytes));
    return v;
}

static void test_nd_linear(int nd, const int64_t *xs, int64_t n, int relu, deft_dtype autocast) {
    static const char *const names[4] = {"y", "dW", "db", "dx"};
    const double tol = autocast ? 2e-2 : 1e-5;   /* cuda_test_matmul_lt's, fused against separate kernels */
    nd_linear fused, plain;
    nd_linear_build(&fused, nd, xs, n, relu, autocast, 1);
    nd_linear_build(&plain, nd, xs, n, relu, autocast, 0);
    if (!fused.p || !plain.p) return;
    /* Two matmul groups: the product with its bias [+ relu], the weight gradient with the bias gradient. Under bf16
     * autocast only the first forms so far: the bias gradient's sum does not read the weight gradient's operand
     * (bench/RESULTS.md, eighteenth round, says what is left). */
    const int grad_group = autocast ? 0 : 1;
    CHECK_MSG(nd_in_matmul_groups(&fused, "matmul") == 1 + grad_group && nd_in_matmul_groups(&fused, "add") == 1 &&
                  nd_in_matmul_groups(&fused, "relu") == relu && nd_in_matmul_groups(&fused, "sum") == grad_group,
              "%dd relu %d %s: matmul groups hold %d matmuls, %d adds, %d relus, %d sums", nd, relu,
              autocast ? "bf16" : "f32", nd_in_matmul_groups(&fused, "matmul"), nd_in_matmul_groups(&fused, "add"),
              nd_in_matmul_groups(&fused, "relu"), nd_in_matmul_groups(&fused, "sum"));
    CHECK(nd_in_matmul_groups(&plain, "matmul") == 0);
    for (int run = 0; run < 2; run++) {
        CHECK_OK(deft_program_run(fused.p));
        CHECK_OK(deft_program_run(plain.p));
    }
    for (int i = 0; i < 4; i++) {
        float *f = nd_read(&fused, i), *u = nd_read(&plain, i);
        const size_t count = deft_tensor_nbytes(fused.outs[i]) / sizeof(float);
        double num = 0, den = 0;
        for (size_t k = 0; k < count; k++) {
            num += ((double)f[k] - u[k]) * ((double)f[k] - u[k]);
            den += (double)u[k] * u[k];
        }
        CHECK_MSG(den > 0 && sqrt(num / den) <= tol, "%dd relu %d %s: %s differs by %g (relative), tolerance %g", nd,
                  relu, autocast ? "bf16" : "f32", names[i], den > 0 ? sqrt(num / den) : -1.0, tol);
        free(f);
        free(u);
    }
    deft_program_free(fused.p);
    deft_program_free(plain.p);
    deft_graph_free(fused.g);
    deft_graph_free(plain.g);
}

static void test_nd_linears(void) {
    static const int64_t x3[3] = {4, 16, 48}, x4[4] = {2, 3, 11, 40}, small3[3] = {3, 5, 24};
    static const deft_dtype acs[2] = {DEFT_F32, DEFT_BF16};
    for (int a = 0; a < 2; a++)
        for (int relu = 0; relu < 2; relu++) {
            test_nd_linear(3, x3, 80, relu, acs[a]);      /* cuBLASLt's epilogues */
            test_nd_linear(4, x4, 72, relu, acs[a]);
            test_nd_linear(3, small3, 40, relu, acs[a]);  /* the small-product kernels' epilogues */
        }
}

/* ---- bf16 and f16 chains: one kernel, rounding after every op, storing what the one-op kernels store ---- */
typedef struct lowp {
    deft_graph *g;
    deft_tensor *in[4], *feed[4];   /* feed[j]: the leaf fed for in[j] (in[j] may be a view of it) */
    deft_tensor *out[3];
    int n_in, n_out;
} lowp;

static deft_tensor *lowp_input(lowp *c, deft_dtype dt, int ndim, const int64_t *shape) {
    static const char *names[4] = {"x0", "x1", "x2", "x3"};
    deft_tensor *t = deft_input(c->g, names[c->n_in], dt, ndim, shape, GPU);
    c->in[c->n_in] = c->feed[c->n_in] = t;
    c->n_in++;
    return t;
}

/* Values in [-3, 3] with exact zeros of both signs among them (the edges of relu and its gradient). */
static void *lowp_host(const deft_tensor *t, uint64_t *rng) {
    const int64_t n = (int64_t)(deft_tensor_nbytes(t) / deft_dtype_size(deft_tensor_dtype(t)));
    void *h = malloc(deft_tensor_nbytes(t));
    CHECK(h != NULL);
    for (int64_t i = 0; h && i < n; i++)
        ref_store(h, deft_tensor_dtype(t), i, i % 17 == 3 ? 0.0 : i % 17 == 5 ? -0.0 : ref_unif(rng, -3, 3));
    return h;
}

/* Reads every output of p after a run into bufs (one malloc'd block per output). */
static void lowp_run(lowp *c, deft_program *p, void *const *host, void **bufs) {
    for (int j = 0; j < c->n_in; j++)
        CHECK_OK(deft_program_feed(p, c->feed[j], host[j], deft_tensor_nbytes(c->feed[j])));
    CHECK_OK(deft_program_run(p));
    for (int o = 0; o < c->n_out; o++) CHECK_OK(deft_program_read(p, c->out[o], bufs[o], deft_tensor_nbytes(c->out[o])));
}

/* c compiled with and without fusion: the fused program runs want_steps kernels, and four runs of each (eager,
 * eager, capture, replay) give the same bytes in every output. Frees c's graph. */
static void lowp_check(const char *name, lowp *c, int want_steps) {
    CHECK_MSG(deft_graph_error(c->g) == DEFT_OK, "%s: %s", name, deft_graph_errmsg(c->g));
    deft_program *pf =
        deft_compile(c->g, c->out, c->n_out, &(deft_compile_options){.fuse_low_precision = fuse_low_precision});
    deft_program *pu = deft_compile(c->g, c->out, c->n_out, &(deft_compile_options){.no_fusion = 1});
    CHECK_MSG(pf && pu, "%s: compile: %s", name, deft_errmsg());
    if (pf && pu) {
        CHECK_MSG(deft_program_step_count(pf) == want_steps, "%s: %d fused steps (%d unfused), want %d", name,
                  deft_program_step_count(pf), deft_program_step_count(pu), want_steps);
        uint64_t rng = 0x5eed;
        void *host[4] = {0}, *bf[3] = {0}, *bu[3] = {0};
        for (int j = 0; j < c->n_in; j++) host[j] = lowp_host(c->feed[j], &rng);
        for (int o = 0; o < c->n_out; o++) {
            bf[o] = malloc(deft_tensor_nbytes(c->out[o]));
            bu[o] = malloc(deft_tensor_nbytes(c->out[o]));
            CHECK(bf[o] && bu[o]);
        }
        for (int run = 0; run < 4; run++) {
            lowp_run(c, pf, host, bf);
            lowp_run(c, pu, host, bu);
            for (int o = 0; o < c->n_out; o++)
                CHECK_MSG(memcmp(bf[o], bu[o], deft_tensor_nbytes(c->out[o])) == 0, "%s run %d: output %d fused != unfused",
                          name, run, o);
        }
        for (int j = 0; j < c->n_in; j++) free(host[j]);
        for (int o = 0; o < c->n_out; o++) {
            free(bf[o]);
            free(bu[o]);
        }
    }
    deft_graph_free(c->g);
}

/* A residual block's end: relu(x + y), the sum also read outside (two stores). rows x cols picks the path: a size
 * that is a multiple of 8 runs 16 bytes per load, any other size also runs its tail element by element. */
static void test_add_relu(deft_dtype dt, int64_t rows, int64_t cols) {
    lowp c = {.g = deft_graph_new()};
    const int64_t shape[2] = {rows, cols};
    deft_tensor *s = deft_add(lowp_input(&c, dt, 2, shape), lowp_input(&c, dt, 2, shape));
    c.out[c.n_out++] = deft_relu(s);
    c.out[c.n_out++] = s;
    char name[64];
    snprintf(name, sizeof name, "%s add->relu %lldx%lld", deft_dtype_name(dt), (long long)rows, (long long)cols);
    lowp_check(name, &c, 1);
}

/* Two branches' gradients summed, then the ReLU's gradient. */
static void test_add_act_grad(deft_dtype dt, int64_t n) {
    lowp c = {.g = deft_graph_new()};
    deft_tensor *dy = deft_add(lowp_input(&c, dt, 1, &n), lowp_input(&c, dt, 1, &n));
    c.out[c.n_out++] = deft_testing_act_grad("relu", dy, lowp_input(&c, dt, 1, &n));
    char name[64];
    snprintf(name, sizeof name, "%s add->act_grad(relu) %lld", deft_dtype_name(dt), (long long)n);
    lowp_check(name, &c, 1);
}

/* sigmoid(0.3 x + b), b of the chain's shape or broadcast along rows (a strided load). */
static void test_scale_add_sigmoid(deft_dtype dt, int broadcast) {
    lowp c = {.g = deft_graph_new()};
    deft_tensor *x = lowp_input(&c, dt, 2, (int64_t[]){ROWS, COLS});
    deft_tensor *b = broadcast ? lowp_input(&c, dt, 1, (int64_t[]){COLS}) : lowp_input(&c, dt, 2, (int64_t[]){ROWS, COLS});
    c.out[c.n_out++] = deft_sigmoid(deft_add(deft_mul_scalar(x, 0.3), b));
    char name[64];
    snprintf(name, sizeof name, "%s mul_scalar->add->sigmoid%s", deft_dtype_name(dt), broadcast ? ", broadcast" : "");
    lowp_check(name, &c, 1);
}

/* relu(x * row + col + one): inputs broadcast along either axis, and one of a single element. */
static void test_broadcasts(deft_dtype dt) {
    lowp c = {.g = deft_graph_new()};
    deft_tensor *x = lowp_input(&c, dt, 2, (int64_t[]){ROWS, COLS});
    deft_tensor *row = lowp_input(&c, dt, 1, (int64_t[]){COLS}), *col = lowp_input(&c, dt, 2, (int64_t[]){ROWS, 1});
    deft_tensor *one = lowp_input(&c, dt, 1, (int64_t[]){1});
    c.out[c.n_out++] = deft_relu(deft_add(deft_add(deft_mul(x, row), col), one));
    char name[64];
    snprintf(name, sizeof name, "%s broadcast inputs", deft_dtype_name(dt));
    lowp_check(name, &c, 1);
}

/* mean (or sum) of 0.5 (a - b)^2, with a - b stored beside it: one kernel, the reduction in the chain's dtype. */
static void test_lowp_reduction(deft_dtype dt, int mean) {
    lowp c = {.g = deft_graph_new()};
    const int64_t shape[2] = {ROWS, COLS};
    deft_tensor *d = deft_sub(lowp_input(&c, dt, 2, shape), lowp_input(&c, dt, 2, shape));
    deft_tensor *sq = deft_mul_scalar(deft_mul(d, d), 0.5);
    c.out[c.n_out++] = mean ? deft_mean(sq, 0, NULL, 0) : deft_sum(sq, 0, NULL, 0);
    c.out[c.n_out++] = d;
    char name[64];
    snprintf(name, sizeof name, "%s chain ending in a %s", deft_dtype_name(dt), mean ? "mean" : "sum");
    lowp_check(name, &c, 1);
}

/* bf16 -> f32 -> (+ f32, relu) -> bf16: casts join the chain, and the f32 sum is stored as f32. */
static void test_casts(int64_t n) {
    lowp c = {.g = deft_graph_new()};
    deft_tensor *x = deft_cast(lowp_input(&c, DEFT_BF16, 1, &n), DEFT_F32);
    deft_tensor *s = deft_add(x, lowp_input(&c, DEFT_F32, 1, &n));
    c.out[c.n_out++] = deft_cast(deft_relu(s), DEFT_BF16);
    c.out[c.n_out++] = s;
    c.out[c.n_out++] = deft_cast(deft_mul_scalar(s, 1.0 / 3.0), DEFT_F16);
    lowp_check("casts bf16 -> f32 -> bf16, f16", &c, 1);
}

/* Inputs that are views into a leaf at `start` elements: at 1 the view is not 16-byte aligned and the chain runs
 * element by element; at 8 (16 bytes of bf16) it may take 16 bytes at a time. */
static void test_views(deft_dtype dt, int64_t start) {
    lowp c = {.g = deft_graph_new()};
    const int64_t n = 1000, whole = n + 8;
    deft_tensor *src = lowp_input(&c, dt, 1, &whole);
    c.in[0] = deft_slice(src, 0, start, start + n, 1);
    deft_tensor *y = lowp_input(&c, dt, 1, &n);
    c.out[c.n_out++] = deft_relu(deft_add(c.in[0], y));
    char name[64];
    snprintf(name, sizeof name, "%s view at %lld", deft_dtype_name(dt), (long long)start);
    lowp_check(name, &c, 1);
}

/* f64 and i32 chains are not fused: two kernels, as before. */
static void test_unfused_dtypes(void) {
    const deft_dtype dts[2] = {DEFT_F64, DEFT_I32};
    for (int k = 0; k < 2; k++) {
        lowp c = {.g = deft_graph_new()};
        const int64_t n = 100;
        c.out[c.n_out++] = deft_relu(deft_add(lowp_input(&c, dts[k], 1, &n), lowp_input(&c, dts[k], 1, &n)));
        lowp_check(deft_dtype_name(dts[k]), &c, 2);
    }
}

/* A kernel description with a dtype the fused kernel does not load is refused before anything runs. */
static void test_bad_kernel(void) {
#ifdef DEFT_HAVE_CUDA
    CHECK_ERR(deft_testing_fused_relu(DEFT_F64, 4), DEFT_ERR_DTYPE, "other than f32, bf16 or f16");
#endif
}

static void test_fusion_lowp(void) {
    const deft_dtype dts[2] = {DEFT_BF16, DEFT_F16};
    for (int k = 0; k < 2; k++) {
        test_add_relu(dts[k], ROWS, COLS);    /* 1073 elements: vector steps and a tail of 1 */
        test_add_relu(dts[k], 64, 128);       /* whole 16-byte steps only */
        test_add_relu(dts[k], 1, 7);          /* fewer elements than one vector step */
        test_add_act_grad(dts[k], 4099);
        test_add_act_grad(dts[k], 4096);
        test_scale_add_sigmoid(dts[k], 0);
        test_scale_add_sigmoid(dts[k], 1);
        test_broadcasts(dts[k]);
        test_lowp_reduction(dts[k], 1);
        test_lowp_reduction(dts[k], 0);
        test_views(dts[k], 1);
        test_views(dts[k], 8);
    }
    test_casts(1001);
    test_casts(1024);
    test_unfused_dtypes();
    test_bad_kernel();
}

int main(void) {
    if (deft_cuda_device_count() == 0) {
        printf("no usable CUDA GPU: skipped\n");
        return DEFT_CHECK_SKIP;
    }
    test_random_chains(DEFT_F32);
    fuse_low_precision = 1;   /* bf16 and f16 chains fuse only when asked (passes/fusion.c) */
    test_random_chains(DEFT_BF16);
    test_random_chains(DEFT_F16);
    test_fusion_lowp();
    CHECK_OK(deft_testing_set_debug("FUSED_REFERENCE", 1));   /* the one-element kernel on the same chains */
    test_fusion_lowp();
    test_random_chains(DEFT_BF16);
    CHECK_OK(deft_testing_set_debug("FUSED_REFERENCE", 0));
    test_chain_reduction(1, 32, 1, 1);      /* the tiny MLP's MSE */
    test_chain_reduction(0, 37, 29, 1);
    test_chain_reduction(1, 256, 256, 1);   /* the largest chain one block reduces */
    test_chain_reduction(1, 257, 256, 2);   /* past it, the reduction runs on its own */
    test_mlp(1, 0, 1e-5);
    test_mlp(0, 0, 1e-5);
    test_mlp(0, 1, 5e-3);
    test_nd_linears();
    return deft_check_finish();
}
