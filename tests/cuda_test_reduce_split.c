/* Reductions with few outputs and long rows on a GPU, which split each row over several blocks and add the blocks'
 * partials in a fixed order (ops/cuda/cuda_reduce.cu, graph_internal.h's deft_reduce_split_parts): sum, mean and
 * max in f32, bf16 and f64 (and an i32 sum) over shapes that take that path (a [16, 12, 1024, 64] tensor to a scalar,
 * four rows of 100000, two reduced axes around a kept one), against the CPU from the same data: max exactly, sums
 * and means within one rounding of the output dtype (both accumulate in double, in other orders); and the same bits
 * on a second run. A shape just below the split's length bound checks the plain path beside it.
 * Skips (exit 77) without a GPU; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in (to check the test). */
#include "check.h"
#include "ref.h"

typedef struct split_case {
    const char *name;
    int ndim;
    int64_t shape[4];
    int naxes;         /* 0: every axis */
    int axes[3];
} split_case;

static const split_case cases[] = {
    {"[16, 12, 1024, 64] to a scalar", 4, {16, 12, 1024, 64}, 0, {0}},
    {"[4, 100000] over axis 1", 2, {4, 100000}, 1, {1}},
    {"[8, 3, 20000] over axes 0 and 2", 3, {8, 3, 20000}, 2, {0, 2}},
    {"[2, 65536] over axis 1 (below the split)", 2, {2, 65536}, 1, {1}},
};

typedef enum { OP_SUM, OP_MEAN, OP_MAX } red_op;
static const char *op_name[] = {"sum", "mean", "max"};

/* The reduction of x on dev, run `runs` times; the last run's value into out (raw, the input's dtype). */
static int run_reduce(deft_device dev, const split_case *c, red_op op, const ref_tensor *x, void *out,
                      void *first_run, int64_t *nout) {
    deft_graph *g = deft_graph_new();
    deft_tensor *xt = deft_constant(g, x->dt, x->ndim, x->shape, dev, x->raw, (size_t)x->n * ref_esize(x->dt));
    deft_tensor *y = op == OP_SUM    ? deft_sum(xt, c->naxes, c->naxes ? c->axes : NULL, 0)
                     : op == OP_MEAN ? deft_mean(xt, c->naxes, c->naxes ? c->axes : NULL, 0)
                                     : deft_max(xt, c->naxes, c->naxes ? c->axes : NULL, 0);
    deft_program *p = y ? deft_compile(g, &y, 1, NULL) : NULL;
    CHECK_MSG(p != NULL, "%s %s: compile: %s", c->name, op_name[op], deft_errmsg());
    int ok = p != NULL;
    if (ok) {
        *nout = deft_tensor_numel(y);
        const size_t bytes = (size_t)*nout * ref_esize(x->dt);
        ok = deft_program_run(p) == DEFT_OK && deft_program_read(p, y, first_run, bytes) == DEFT_OK &&
             deft_program_run(p) == DEFT_OK && deft_program_read(p, y, out, bytes) == DEFT_OK;
        CHECK_MSG(ok, "%s %s: run: %s", c->name, op_name[op], deft_errmsg());
    }
    deft_program_free(p);
    deft_graph_free(g);
    return ok;
}

static double rel_tol(deft_dtype dt) {
    return dt == DEFT_BF16 ? 1.0 / 128 : dt == DEFT_F32 ? 2e-7 : dt == DEFT_F64 ? 1e-12 : 0.0;
}

static void check_case(deft_device gpu, const split_case *c, deft_dtype dt, red_op op, uint64_t *rng) {
    ref_tensor x = dt == DEFT_I32 ? ref_random(rng, dt, c->ndim, c->shape, -50, 60)
                                  : ref_random(rng, dt, c->ndim, c->shape, -1, 3);
    double *want_raw = calloc(64, 8), *have = calloc(64, 8), *have1 = calloc(64, 8), *scratch = calloc(64, 8);
    int64_t nw = 0, nh = 0;
    if (run_reduce(deft_cpu(), c, op, &x, want_raw, scratch, &nw) && run_reduce(gpu, c, op, &x, have, have1, &nh)) {
        CHECK(nw == nh && nh <= 64);
        CHECK_MSG(memcmp(have, have1, (size_t)nh * ref_esize(dt)) == 0, "%s %s %s: two runs differ", c->name,
                  op_name[op], deft_dtype_name(dt));
        for (int64_t i = 0; i < nh && nw == nh; i++) {
            const double w = ref_load(want_raw, dt, i), h = ref_load(have, dt, i);
            const double tol = op == OP_MAX ? 0.0 : rel_tol(dt) * fabs(w);
            CHECK_MSG(fabs(h - w) <= tol, "%s %s %s: output %lld: gpu %.17g, cpu %.17g", c->name, op_name[op],
                      deft_dtype_name(dt), (long long)i, h, w);
        }
    }
    free(want_raw), free(have), free(have1), free(scratch);
    ref_free(&x);
}

int main(void) {
    deft_device gpu;
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    static const deft_dtype dts[] = {DEFT_F32, DEFT_BF16, DEFT_F64};
    uint64_t rng = 0x5b1177ull;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        for (int di = 0; di < 3; di++)
            for (int op = OP_SUM; op <= OP_MAX; op++) check_case(gpu, &cases[ci], dts[di], (red_op)op, &rng);
        check_case(gpu, &cases[ci], DEFT_I32, OP_SUM, &rng);   /* int64 partials; the i32 sum wraps as on the CPU */
    }
    return deft_check_finish();
}
