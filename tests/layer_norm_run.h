/* Layer norm test cases shared by test_layer_norm.c (CPU) and cuda_test_layer_norm.c: a float64 reference of the
 * forward and backward passes, and one training step on a device that returns every value as doubles.
 *
 * Plain case: loss = sum(layer_norm(x, w, b) * r). Residual case (a pre-norm block's stream): s = a + cast(b2),
 * y = layer_norm(s, w, b), h = s + tanh(y), loss = sum(h * r): s is read past the layer norm and its gradient is
 * d_res + dx, the two patterns the GPU fuses. Include after check.h and ref.h. */
#ifndef DEFT_TEST_LAYER_NORM_RUN_H
#define DEFT_TEST_LAYER_NORM_RUN_H

#include "deft_testing.h"   /* deft_layer_norm_as */

typedef struct ln_case {
    int ndim;
    int64_t shape[4];
    int weight, bias;
    double eps;
    int residual;          /* the residual case */
    deft_dtype b2_dtype;   /* residual: b2's dtype (cast to the case's when it differs) */
} ln_case;

/* Called with the program ln_run_with compiled and its outputs (loss, y, grad x, ...), before it runs. */
typedef void (*ln_compiled_fn)(deft_program *p, deft_tensor *const *outs, int n, void *ctx);

typedef struct ln_values {
    ref_tensor x, w, b, r, b2;   /* x is a in the residual case */
} ln_values;

typedef struct ln_result {
    double *y, *s, *dx, *dw, *db, *db2;   /* s and db2: residual case only; dw, db when the node has them */
} ln_result;

static inline int64_t ln_cols(const ln_case *c) { return c->shape[c->ndim - 1]; }
static inline int64_t ln_numel(const ln_case *c) { return ref_numel(c->ndim, c->shape); }

static inline ln_values ln_random(uint64_t *rng, const ln_case *c, deft_dtype dt) {
    const int64_t cols = ln_cols(c);
    ln_values v;
    v.x = ref_random(rng, dt, c->ndim, c->shape, -2.0, 3.0);   /* an offset mean: the centring matters */
    v.w = ref_random(rng, dt, 1, &cols, 0.5, 1.5);
    v.b = ref_random(rng, dt, 1, &cols, -0.5, 0.5);
    v.r = ref_random(rng, dt, c->ndim, c->shape, -1.0, 1.0);
    v.b2 = ref_random(rng, c->residual ? c->b2_dtype : dt, c->ndim, c->shape, -1.0, 1.0);
    return v;
}

static inline void ln_values_free(ln_values *v) {
    ref_free(&v->x), ref_free(&v->w), ref_free(&v->b), ref_free(&v->r), ref_free(&v->b2);
}

/* The plain case's values, gradients included (dy = r), in double from the stored inputs. */
static inline void ln_reference(const ln_case *c, const ln_values *v, ln_result *out) {
    const int64_t cols = ln_cols(c), rows = ln_numel(c) / cols, n = ln_numel(c);
    out->y = calloc((size_t)n, sizeof(double)), out->dx = calloc((size_t)n, sizeof(double));
    out->dw = calloc((size_t)cols, sizeof(double)), out->db = calloc((size_t)cols, sizeof(double));
    out->s = out->db2 = NULL;
    for (int64_t i = 0; i < rows; i++) {
        const double *x = v->x.v + i * cols, *dy = v->r.v + i * cols;
        double mean = 0.0, var = 0.0, sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < cols; j++) mean += x[j] / (double)cols;
        for (int64_t j = 0; j < cols; j++) var += (x[j] - mean) * (x[j] - mean) / (double)cols;
        const double rstd = 1.0 / sqrt(var + c->eps);
        for (int64_t j = 0; j < cols; j++) {
            const double xh = (x[j] - mean) * rstd, w = c->weight ? v->w.v[j] : 1.0;
            out->y[i * cols + j] = xh * w + (c->bias ? v->b.v[j] : 0.0);
            sg += dy[j] * w;
            sgx += dy[j] * w * xh;
            out->dw[j] += dy[j] * xh;
            out->db[j] += dy[j];
        }
        for (int64_t j = 0; j < cols; j++) {
            const double xh = (x[j] - mean) * rstd, w = c->weight ? v->w.v[j] : 1.0;
            out->dx[i * cols + j] = rstd * (dy[j] * w - sg / (double)cols - xh * sgx / (double)cols);
        }
    }
}

static inline deft_tensor *ln_param(deft_graph *g, const char *name, const ref_tensor *t, deft_device dev) {
    deft_tensor *p = deft_param(g, name, t->dt, t->ndim, t->shape, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(p, t->raw, (size_t)t->n * deft_dtype_size(t->dt)));
    return p;
}

static inline double *ln_read(deft_program *p, const deft_tensor *t) {
    CHECK_MSG(t != NULL, "no tensor to read: %s", deft_errmsg());
    if (!t) return NULL;
    const int64_t n = deft_tensor_numel(t);
    const deft_dtype dt = deft_tensor_dtype(t);
    void *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    double *out = malloc((size_t)n * sizeof(double) + 8);
    CHECK_OK(deft_program_read(p, t, raw, (size_t)n * deft_dtype_size(dt)));
    for (int64_t i = 0; i < n; i++) out[i] = ref_load(raw, dt, i);
    free(raw);
    return out;
}

/* One step of the case on dev in dt, compiled with opts (then `compiled` called, when not NULL); 0 when the compile
 * failed (a failed check). value: the layer norm's value in bf16 or f16 from f32 x (autocast's, deft_layer_norm_as;
 * dy in it too: r in it, or in the residual case tanh(y) cast back to x's dtype), or DEFT_F32 (0) for x's dtype. */
static inline int ln_run_with(const ln_case *c, const ln_values *v, deft_dtype dt, deft_dtype value, deft_device dev,
                              const deft_compile_options *opts, ln_result *out, ln_compiled_fn compiled, void *ctx) {
    memset(out, 0, sizeof *out);
    const deft_dtype vt = value != DEFT_F32 ? value : dt;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = ln_param(g, "x", &v->x, dev);
    deft_tensor *w = c->weight ? ln_param(g, "w", &v->w, dev) : NULL, *b = c->bias ? ln_param(g, "b", &v->b, dev) : NULL;
    deft_tensor *rt = deft_to(ref_const(g, &v->r), dev, c->residual ? dt : vt), *b2 = NULL, *s = x;
    if (c->residual) {
        b2 = ln_param(g, "b2", &v->b2, dev);
        s = deft_add(x, v->b2.dt == dt ? b2 : deft_cast(b2, dt));
    }
    deft_tensor *y = vt != dt ? deft_layer_norm_as(s, w, b, c->eps, vt) : deft_layer_norm(s, w, b, c->eps);
    deft_tensor *hy = c->residual && vt != dt ? deft_cast(deft_tanh(y), dt) : c->residual ? deft_tanh(y) : NULL;
    deft_tensor *h = c->residual ? deft_add(s, hy) : y;
    deft_tensor *loss = deft_sum(deft_mul(h, rt), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[7] = {loss, y, deft_grad(x)};
    int n = 3;
    const int iw = w ? n++ : -1, ib = b ? n++ : -1, is = c->residual ? n++ : -1, ib2 = c->residual ? n++ : -1;
    if (iw >= 0) outs[iw] = deft_grad(w);
    if (ib >= 0) outs[ib] = deft_grad(b);
    if (is >= 0) outs[is] = s;
    if (ib2 >= 0) outs[ib2] = deft_grad(b2);
    deft_program *p = deft_compile(g, outs, n, opts);
    CHECK_MSG(p != NULL, "layer_norm %s compile: %s", deft_dtype_name(dt), deft_errmsg());
    if (p && compiled) compiled(p, outs, n, ctx);
    if (p) {
        CHECK_OK(deft_program_run(p));
        out->y = ln_read(p, y);
        out->dx = ln_read(p, outs[2]);
        if (iw >= 0) out->dw = ln_read(p, outs[iw]);
        if (ib >= 0) out->db = ln_read(p, outs[ib]);
        if (is >= 0) out->s = ln_read(p, s);
        if (ib2 >= 0) out->db2 = ln_read(p, outs[ib2]);
    }
    deft_graph_free(g);
    return p != NULL;
}

static inline int ln_run(const ln_case *c, const ln_values *v, deft_dtype dt, deft_device dev,
                         const deft_compile_options *opts, ln_result *out) {
    return ln_run_with(c, v, dt, DEFT_F32, dev, opts, out, NULL, NULL);
}

static inline void ln_result_free(ln_result *r) {
    free(r->y), free(r->s), free(r->dx), free(r->dw), free(r->db), free(r->db2);
    memset(r, 0, sizeof *r);
}

#endif
