/* The 16-byte paths of unary and scalar ops and of activation gradients on a GPU (ops/cuda/cuda_elementwise.cu,
 * cuda_train.cu) against the one-element kernels beside them (the MAP_SCALAR debug knob): each element goes through
 * the same function, so both must agree byte for byte, on every floating dtype, on sizes that leave a tail of every
 * length and on views that start off 16 bytes (which take the one-element kernel). Both also match the CPU within
 * the dtype's tolerance. Skips (exit 77) where no GPU works. */
#include "cuda_compare.h"

static uint64_t rng = 0x3a9ec0001ull;

typedef struct map_case {
    const char *name;
    deft_tensor *(*op)(deft_tensor *);
    int offset;   /* 1: the op reads a view one row in, so its start is off 16 bytes for an odd row length */
} map_case;

static deft_tensor *mul_three(deft_tensor *a) { return deft_mul_scalar(a, 3.0); }

static const map_case ops[] = {
    {"gelu_tanh", deft_gelu_tanh, 0}, {"gelu", deft_gelu, 0},       {"exp", deft_exp, 0},
    {"tanh", deft_tanh, 1},           {"sigmoid", deft_sigmoid, 0}, {"silu", deft_silu, 1},
    {"relu", deft_relu, 0},           {"neg", deft_neg, 1},         {"mul_scalar", mul_three, 0},
};

/* Rows of the input: with `offset` the op reads rows 1.. of a [rows + 1, cols] tensor. */
static const int64_t sizes[][2] = {{1, 1}, {1, 7}, {1, 8}, {3, 17}, {5, 1031}, {2, 65541}};

static deft_tensor *build_map(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const map_case *c = ctx;
    const int64_t rows = deft_testing_shape(x[0])[0];
    return c->op(c->offset ? deft_slice(x[0], 0, 1, rows, 1) : x[0]);
}

static void *map_on(deft_device dev, const ref_tensor *in, const map_case *c, int scalar, size_t *bytes) {
    CHECK_OK(deft_testing_set_debug("MAP_SCALAR", scalar));
    deft_tensor *t = NULL;
    deft_graph *g = NULL;
    deft_status st = DEFT_OK;
    void *out = build_and_realize(dev, 1, in, build_map, c, &t, &g, &st);
    CHECK_MSG(out != NULL, "%s: %s", c->name, deft_errmsg());
    *bytes = t ? deft_tensor_nbytes(t) : 0;
    deft_graph_free(g);
    CHECK_OK(deft_testing_set_debug("MAP_SCALAR", 0));
    return out;
}

static void test_maps(deft_device gpu) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int d = 0; d < 4; d++) {
                const int64_t shape[2] = {sizes[s][0] + ops[o].offset, sizes[s][1]};
                ref_tensor in = ref_random(&rng, dts[d], 2, shape, -4, 4);
                size_t b_cpu = 0, b_one = 0, b_vec = 0;
                void *cpu = map_on(deft_cpu(), &in, &ops[o], 0, &b_cpu);
                void *one = map_on(gpu, &in, &ops[o], 1, &b_one);
                void *vec = map_on(gpu, &in, &ops[o], 0, &b_vec);
                CHECK(b_cpu == b_one && b_one == b_vec && b_cpu > 0);
                if (cpu && one && vec && b_cpu == b_one && b_one == b_vec) {
                    CHECK_MSG(memcmp(one, vec, b_vec) == 0, "%s %s [%lld, %lld]: 16-byte kernel differs from the "
                              "one-element one", ops[o].name, dt_names[dts[d]], (long long)shape[0],
                              (long long)shape[1]);
                    const int64_t n = (int64_t)(b_cpu / deft_dtype_size(dts[d]));
                    double *want = to_doubles(cpu, dts[d], n), *have = to_doubles(vec, dts[d], n);
                    ref_close_tol(ops[o].name, have, want, n, ref_tol(dts[d]));
                    free(want);
                    free(have);
                }
                free(cpu);
                free(one);
                free(vec);
                ref_free(&in);
            }
}

/* d/dx sum(act(x) * r) for x [rows, cols]: the backward pass's act_grad, each node its own kernel (no_fusion). */
static void *act_grad_on(deft_device dev, deft_dtype dt, const map_case *c, const ref_tensor *x, const ref_tensor *r,
                         int scalar, size_t *bytes) {
    CHECK_OK(deft_testing_set_debug("MAP_SCALAR", scalar));
    deft_graph *g = deft_graph_new();
    deft_tensor *p = deft_param(g, "x", dt, x->ndim, x->shape, dev, DEFT_INIT_ZEROS);
    CHECK_OK(deft_param_set(p, x->raw, (size_t)x->n * deft_dtype_size(dt)));
    deft_tensor *rc = deft_constant(g, dt, r->ndim, r->shape, dev, r->raw, (size_t)r->n * deft_dtype_size(dt));
    deft_tensor *loss = deft_sum(deft_mul(c->op(p), rc), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *gx = deft_grad(p);
    const deft_compile_options opts = {.no_fusion = 1};
    deft_program *prog = gx ? deft_compile(g, (deft_tensor *[]){gx}, 1, &opts) : NULL;
    CHECK_MSG(prog != NULL, "%s grad: compile: %s", c->name, deft_errmsg());
    void *out = NULL;
    *bytes = 0;
    if (prog) {
        *bytes = deft_tensor_nbytes(gx);
        out = malloc(*bytes);
        CHECK_OK(deft_program_run(prog));
        CHECK_OK(deft_program_read(prog, gx, out, *bytes));
    }
    deft_program_free(prog);
    deft_graph_free(g);
    CHECK_OK(deft_testing_set_debug("MAP_SCALAR", 0));
    return out;
}

static void test_act_grads(deft_device gpu) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    static const map_case acts[] = {{"gelu_tanh", deft_gelu_tanh, 0}, {"gelu", deft_gelu, 0},
                                    {"relu", deft_relu, 0},           {"silu", deft_silu, 0}};
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int d = 0; d < 4; d++) {
                ref_tensor x = ref_random(&rng, dts[d], 2, sizes[s], -4, 4);
                ref_tensor r = ref_random(&rng, dts[d], 2, sizes[s], -1, 1);
                size_t b_one = 0, b_vec = 0;
                void *one = act_grad_on(gpu, dts[d], &acts[a], &x, &r, 1, &b_one);
                void *vec = act_grad_on(gpu, dts[d], &acts[a], &x, &r, 0, &b_vec);
                CHECK(b_one == b_vec && b_one > 0);
                if (one && vec && b_one == b_vec)
                    CHECK_MSG(memcmp(one, vec, b_vec) == 0, "%s grad %s [%lld, %lld]: 16-byte kernel differs from "
                              "the one-element one", acts[a].name, dt_names[dts[d]], (long long)sizes[s][0],
                              (long long)sizes[s][1]);
                free(one);
                free(vec);
                ref_free(&x);
                ref_free(&r);
            }
}

int main(void) {
    deft_device gpu;
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    test_maps(gpu);
    test_act_grads(gpu);
    return deft_check_finish();
}
