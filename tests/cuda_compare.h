/* The harness of the CUDA op tests (cuda_test_ops, cuda_test_ops_train): each case is built twice through the
 * public API, once on the CPU and once on cuda:0, from the same host data, and the CUDA result is compared with
 * the CPU one, which is the reference. */
#ifndef DEFT_TEST_CUDA_COMPARE_H
#define DEFT_TEST_CUDA_COMPARE_H

#include "deft_testing.h"
#include "ref.h"

/* Builds the op under test on `dev` from leaves x[0..] (constants holding the case's host data). */
typedef deft_tensor *(*build_fn)(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx);

/* Compiles t (of g) with opts, runs it once and reads it into host: deft_realize with options. */
static inline deft_status realize_with(deft_graph *g, deft_tensor *t, const deft_compile_options *opts, void *host,
                                       size_t bytes) {
    deft_program *p = NULL;
    deft_status s = deft_compile_into(g, &t, 1, opts, &p);
    if (s == DEFT_OK) s = deft_program_run(p);
    if (s == DEFT_OK) s = deft_program_read(p, t, host, bytes);
    deft_program_free(p);
    return s;
}

/* Builds on `dev` and realizes into a malloc'd host buffer (compiled with opts; NULL: the defaults); NULL (with *st
 * set) when building or running fails. */
static inline void *build_and_realize_with(deft_device dev, int nin, const ref_tensor *ins, build_fn f,
                                           const void *ctx, const deft_compile_options *opts, deft_tensor **out_t,
                                           deft_graph **out_g, deft_status *st) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x[8] = {0};
    for (int i = 0; i < nin; i++)
        x[i] = deft_constant(g, ins[i].dt, ins[i].ndim, ins[i].shape, dev, ins[i].raw,
                             (size_t)ins[i].n * deft_dtype_size(ins[i].dt));
    deft_tensor *t = f(g, dev, x, ctx);
    *out_g = g;
    *out_t = t;
    if (!t) {
        *st = deft_graph_error(g) != DEFT_OK ? deft_graph_error(g) : DEFT_ERR_INVALID;
        return NULL;
    }
    void *buf = malloc(deft_tensor_nbytes(t) + 8);
    *st = opts ? realize_with(g, t, opts, buf, deft_tensor_nbytes(t)) : deft_realize(t, buf, deft_tensor_nbytes(t));
    if (*st != DEFT_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

static inline void *build_and_realize(deft_device dev, int nin, const ref_tensor *ins, build_fn f, const void *ctx,
                                      deft_tensor **out_t, deft_graph **out_g, deft_status *st) {
    return build_and_realize_with(dev, nin, ins, f, ctx, NULL, out_t, out_g, st);
}

static inline double *to_doubles(const void *raw, deft_dtype dt, int64_t n) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = ref_load(raw, dt, i);
    return v;
}

/* One case, the GPU's program compiled with gpu_opts (NULL: the defaults). Where the CPU reference cannot be built
 * or run, nothing is compared and 0 comes back; with cpu_must_work that is a failed check, otherwise the case is
 * reported as skipped. tol < 0 means the dtype's tolerance. 1: the case ran. */
static inline int compare_case_with(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx,
                                    double tol, int cpu_must_work, const deft_compile_options *gpu_opts) {
    deft_tensor *tc, *tg;
    deft_graph *gc, *gg;
    deft_status sc, sg;
    void *ref = build_and_realize(deft_cpu(), nin, ins, f, ctx, &tc, &gc, &sc);
    if (cpu_must_work)
        CHECK_MSG(ref != NULL, "%s on the CPU failed: %s: %s", name, deft_status_name(sc), deft_errmsg());
    if (!ref) {
        if (!cpu_must_work)
            printf("skip %s: the CPU reference fails (%s: %s)\n", name, deft_status_name(sc), deft_errmsg());
        deft_graph_free(gc);
        return 0;
    }
    void *got = build_and_realize_with(deft_cuda(0), nin, ins, f, ctx, gpu_opts, &tg, &gg, &sg);
    CHECK_MSG(got != NULL, "%s on cuda:0 failed: %s: %s", name, deft_status_name(sg), deft_errmsg());
    if (got) {
        const deft_dtype dt = deft_tensor_dtype(tc);
        const int64_t n = deft_tensor_numel(tc);
        CHECK_MSG(deft_tensor_dtype(tg) == dt && deft_tensor_numel(tg) == n,
                  "%s: cpu and cuda outputs differ in form", name);
        double *want = to_doubles(ref, dt, n), *have = to_doubles(got, dt, n);
        ref_close_tol(name, have, want, n, tol < 0 ? ref_tol(dt) : tol);
        free(want);
        free(have);
        free(got);
    }
    free(ref);
    deft_graph_free(gc);
    deft_graph_free(gg);
    return 1;
}

static inline int compare_case(const char *name, int nin, const ref_tensor *ins, build_fn f, const void *ctx,
                               double tol, int cpu_must_work) {
    return compare_case_with(name, nin, ins, f, ctx, tol, cpu_must_work, NULL);
}

static const char *const dt_names[] = {"f32", "f64", "f16", "bf16", "i32"};

#endif
