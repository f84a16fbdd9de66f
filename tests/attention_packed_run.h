/* deft_attention_packed and the composition it replaces, run through the public API for
 * tests/test_attention_packed.c and tests/cuda_test_attention_packed.c: qkv [B, T, 3C] a parameter of dtype dt on
 * dev, y [B, T, C] either deft_attention_packed(qkv) or (apart) q, k, v sliced, reshaped and permuted to
 * [B, H, T, D] as examples/gpt2.h made them, deft_attention, and the output permuted back and reshaped; loss =
 * sum(y * r); y and qkv's gradient read back as doubles. Include after check.h and ref.h. */
#ifndef DEFT_TEST_ATTENTION_PACKED_RUN_H
#define DEFT_TEST_ATTENTION_PACKED_RUN_H

typedef struct pk_shape {
    int64_t b, t, h, d;
    int causal;
    double scale;   /* 0: 1 / sqrt(D) */
} pk_shape;

typedef struct pk_result {
    double *y, *dqkv;   /* B T C and B T 3C values */
} pk_result;

static inline int64_t pk_c(const pk_shape *s) { return s->h * s->d; }
static inline int64_t pk_numel_y(const pk_shape *s) { return s->b * s->t * pk_c(s); }

static inline void pk_result_free(pk_result *r) {
    free(r->y);
    free(r->dqkv);
    *r = (pk_result){0};
}

/* The composition examples/gpt2.h built before deft_attention_packed. */
static inline deft_tensor *pk_apart(deft_tensor *qkv, const pk_shape *s, const deft_attention_options *o) {
    const int64_t c = pk_c(s), heads[4] = {s->b, s->t, s->h, s->d}, flat[3] = {s->b, s->t, c};
    deft_tensor *part[3];
    for (int i = 0; i < 3; i++)
        part[i] = deft_permute(deft_reshape(deft_slice(qkv, 2, i * c, (i + 1) * c, 1), 4, heads),
                               (int[]){0, 2, 1, 3});
    return deft_reshape(deft_permute(deft_attention(part[0], part[1], part[2], o), (int[]){0, 2, 1, 3}), 3, flat);
}

/* Builds, compiles (opts may be NULL) and runs one form once on qkv's values (3 B T C) and r's (B T C); 0 after a
 * failed check. */
static inline int pk_run(const pk_shape *s, int packed, deft_dtype dt, deft_device dev,
                         const deft_compile_options *opts, const double *qkv_v, const double *r_v, pk_result *res) {
    *res = (pk_result){0};
    const int64_t c = pk_c(s), n = pk_numel_y(s), shape[3] = {s->b, s->t, 3 * c}, yshape[3] = {s->b, s->t, c};
    const size_t esz = deft_dtype_size(dt);
    deft_graph *g = deft_graph_new();
    deft_tensor *qkv = deft_param(g, "qkv", dt, 3, shape, dev, DEFT_INIT_ZEROS);
    void *raw = malloc((size_t)(3 * n) * esz + 8);
    for (int64_t i = 0; i < 3 * n; i++) ref_store(raw, dt, i, qkv_v[i]);
    if (qkv) CHECK_OK(deft_param_set(qkv, raw, (size_t)(3 * n) * esz));
    for (int64_t i = 0; i < n; i++) ref_store(raw, dt, i, r_v[i]);
    deft_tensor *rt = deft_constant(g, dt, 3, yshape, dev, raw, (size_t)n * esz);
    free(raw);
    const deft_attention_options o = {.causal = s->causal, .scale = s->scale};
    deft_tensor *y = packed ? deft_attention_packed(qkv, (int)s->h, &o) : pk_apart(qkv, s, &o);
    deft_tensor *loss = deft_sum(deft_mul(y, rt), 0, NULL, 0);
    CHECK_MSG(loss != NULL, "build (packed %d): %s", packed, deft_errmsg());
    if (!loss) {
        deft_graph_free(g);
        return 0;
    }
    CHECK_OK(deft_backward(loss));
    deft_tensor *outs[2] = {y, deft_grad(qkv)};
    deft_program *p = deft_compile(g, outs, 2, opts);
    CHECK_MSG(p != NULL, "compile (packed %d): %s", packed, deft_errmsg());
    int ok = p != NULL;
    if (ok) {
        const deft_status st = deft_program_run(p);
        CHECK_MSG(st == DEFT_OK, "run (packed %d): %s", packed, deft_errmsg());
        ok = st == DEFT_OK;
    }
    if (ok) {
        res->y = ref_read_program(p, y, n);
        res->dqkv = ref_read_program(p, outs[1], 3 * n);
    }
    deft_graph_free(g);
    return ok;
}

/* qkv uniform in [-range, range) and r in [-1, 1), rounded to dt. */
static inline void pk_random(uint64_t *rng, const pk_shape *s, deft_dtype dt, double range, double **qkv,
                             double **r) {
    const int64_t n = pk_numel_y(s);
    *qkv = malloc((size_t)(3 * n) * sizeof(double) + 8);
    *r = malloc((size_t)n * sizeof(double) + 8);
    for (int64_t i = 0; i < 3 * n; i++) (*qkv)[i] = ref_round(dt, ref_unif(rng, -range, range));
    for (int64_t i = 0; i < n; i++) (*r)[i] = ref_round(dt, ref_unif(rng, -1.0, 1.0));
}

/* How many of n values differ (== : the same bits up to the sign of a zero; a NaN differs from everything). */
static inline int64_t pk_differ(const double *a, const double *b, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += !(a[i] == b[i]);
    return k;
}

/* The largest |a - b| over the largest |b| (at least 0.01); NaN anywhere gives infinity. */
static inline double pk_rel_err(const double *a, const double *b, int64_t n) {
    double err = 0.0, mag = 0.01;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i] || b[i] != b[i]) return INFINITY;
        err = fmax(err, fabs(a[i] - b[i]));
        mag = fmax(mag, fabs(b[i]));
    }
    return err / mag;
}

#endif
