/* deft_attention run through the public API for tests/test_attention.c and tests/cuda_test_attention.c: q, k and v
 * as parameters of dtype dt on dev, loss = sum(out * r), the output and (optionally) the three gradients read back as
 * doubles. Include after check.h, ref.h and attention_ref.h. */
#ifndef DEFT_TEST_ATTENTION_RUN_H
#define DEFT_TEST_ATTENTION_RUN_H

typedef struct att_result {
    double *out, *dq, *dk, *dv;   /* numel each; the gradients NULL without them */
} att_result;

static inline void att_result_free(att_result *r) {
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    *r = (att_result){0};
}

static inline deft_tensor *att_param(deft_graph *g, const char *name, const att_shape *s, deft_dtype dt,
                                     deft_device dev, const double *v) {
    const int64_t shape[4] = {s->b, s->h, s->t, s->d}, n = att_numel(s);
    deft_tensor *p = deft_param(g, name, dt, 4, shape, dev, DEFT_INIT_ZEROS);
    void *raw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    for (int64_t i = 0; i < n; i++) ref_store(raw, dt, i, v[i]);
    if (p) CHECK_OK(deft_param_set(p, raw, (size_t)n * deft_dtype_size(dt)));
    free(raw);
    return p;
}

/* Builds, compiles (opts may be NULL) and runs the case once; 0 after a failed check. */
static inline int att_run(const att_shape *s, deft_dtype dt, deft_device dev, const deft_compile_options *opts,
                          const double *const qkv[3], const double *r, int grads, att_result *res) {
    *res = (att_result){0};
    const int64_t n = att_numel(s), shape[4] = {s->b, s->h, s->t, s->d};
    deft_graph *g = deft_graph_new();
    deft_tensor *q = att_param(g, "q", s, dt, dev, qkv[0]), *k = att_param(g, "k", s, dt, dev, qkv[1]);
    deft_tensor *v = att_param(g, "v", s, dt, dev, qkv[2]);
    void *rraw = malloc((size_t)n * deft_dtype_size(dt) + 8);
    for (int64_t i = 0; i < n; i++) ref_store(rraw, dt, i, r[i]);
    deft_tensor *rt = deft_constant(g, dt, 4, shape, dev, rraw, (size_t)n * deft_dtype_size(dt));
    free(rraw);
    const deft_attention_options o = {.causal = s->causal, .scale = s->scale};
    deft_tensor *out = deft_set_name(deft_attention(q, k, v, &o), "attn");
    deft_tensor *loss = deft_sum(deft_mul(out, rt), 0, NULL, 0);
    CHECK_MSG(loss != NULL, "build: %s", deft_errmsg());
    if (!loss) {
        deft_graph_free(g);
        return 0;
    }
    if (grads) CHECK_OK(deft_backward(loss));
    deft_tensor *outs[4] = {out, grads ? deft_grad(q) : NULL, grads ? deft_grad(k) : NULL,
                            grads ? deft_grad(v) : NULL};
    deft_program *p = deft_compile(g, outs, grads ? 4 : 1, opts);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    int ok = p != NULL;
    if (ok) {
        const deft_status st = deft_program_run(p);
        CHECK_MSG(st == DEFT_OK, "run: %s", deft_errmsg());
        ok = st == DEFT_OK;
    }
    if (ok) {
        res->out = ref_read_program(p, out, n);
        if (grads) {
            res->dq = ref_read_program(p, outs[1], n);
            res->dk = ref_read_program(p, outs[2], n);
            res->dv = ref_read_program(p, outs[3], n);
        }
    }
    deft_graph_free(g);
    return ok;
}

/* q, k, v uniform in [-lo_hi, lo_hi) and r in [-1, 1), rounded to dt so that every backend sees the same values. */
static inline void att_random(uint64_t *rng, const att_shape *s, deft_dtype dt, double range, double *qkv[3],
                              double **r) {
    const int64_t n = att_numel(s);
    for (int j = 0; j < 3; j++) {
        qkv[j] = malloc((size_t)n * sizeof(double) + 8);
        for (int64_t i = 0; i < n; i++) qkv[j][i] = ref_round(dt, ref_unif(rng, -range, range));
    }
    *r = malloc((size_t)n * sizeof(double) + 8);
    for (int64_t i = 0; i < n; i++) (*r)[i] = ref_round(dt, ref_unif(rng, -1.0, 1.0));
}

static inline void att_random_free(double *qkv[3], double *r) {
    for (int j = 0; j < 3; j++) free(qkv[j]);
    free(r);
}

#endif
