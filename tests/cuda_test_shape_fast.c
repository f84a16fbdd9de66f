/* The fast layout kernels of ops/cuda/cuda_shape.cu (rows moved in vectors of up to 16 bytes where the innermost
 * dim stays innermost, shared-memory tiles for transposes, row-wise concat) against the plain one-element kernels
 * they stand beside (the SHAPE_REFERENCE debug knob) and against the CPU: permutes, strided slices and concats move
 * bits, so all three must agree byte for byte, on every dtype, odd sizes and inputs at odd offsets (views).
 * Then a GPT-2-like block (qkv sliced, heads permuted) whose gradient must be bitwise the same with the fast or
 * plain kernels and with the slice gradients joined or added (SLICE_GRAD_ADDS). What the fast kernels gain is
 * measured in traces of the GPT-2 step (bench/RESULTS.md, eighteenth round), not here. Skips (exit 77) where no GPU
 * works. */
#include "cuda_compare.h"

static uint64_t rng = 0x5ea9e0001ull;

typedef struct shape_case {
    const char *name;
    int kind;                    /* K_* */
    int ndim;
    int64_t shape[5];
    int perm[5];
    int axis;                    /* slice and concat */
    int64_t start, end;          /* slice; concat: the sizes of its three inputs along axis are start, end, 3 */
} shape_case;

enum { K_PERMUTE, K_VIEW_PERMUTE, K_SLICE_PERMUTE, K_SLICE, K_CONCAT };

/* K_VIEW_PERMUTE: the permute reads a view at an odd offset (a contiguous slice of axis 0 from 1). K_SLICE_PERMUTE:
 * GPT-2's q: a copied slice of the last axis, reshaped to heads and permuted (shape holds [B, T, H, D]). */
static deft_tensor *build(deft_graph *g, deft_device dev, deft_tensor *const *x, const void *ctx) {
    (void)g, (void)dev;
    const shape_case *c = ctx;
    switch (c->kind) {
    case K_PERMUTE: return deft_permute(x[0], c->perm);
    case K_VIEW_PERMUTE: return deft_permute(deft_slice(x[0], 0, 1, c->shape[0], 1), c->perm);
    case K_SLICE_PERMUTE: {
        deft_tensor *q = deft_slice(x[0], 2, c->start, c->end, 1);
        return deft_permute(deft_reshape(q, 4, c->shape), c->perm);
    }
    case K_SLICE: return deft_slice(x[0], c->axis, c->start, c->end, 1);
    default: return deft_concat(x, 3, c->axis);
    }
}

/* The inputs of a case: one tensor, or three for a concat. */
static int make_inputs(const shape_case *c, deft_dtype dt, ref_tensor *in) {
    const double lo = dt == DEFT_I32 ? -1e6 : -3, hi = dt == DEFT_I32 ? 1e6 : 3;
    if (c->kind == K_SLICE_PERMUTE) {
        const int64_t s[3] = {c->shape[0], c->shape[1], 3 * c->shape[2] * c->shape[3]};
        in[0] = ref_random(&rng, dt, 3, s, lo, hi);
        return 1;
    }
    if (c->kind != K_CONCAT) {
        in[0] = ref_random(&rng, dt, c->ndim, c->shape, lo, hi);
        return 1;
    }
    const int64_t lens[3] = {c->start, c->end, 3};
    for (int k = 0; k < 3; k++) {
        int64_t s[5];
        memcpy(s, c->shape, sizeof s);
        s[c->axis] = lens[k];
        in[k] = ref_random(&rng, dt, c->ndim, s, lo, hi);
    }
    return 3;
}

static void *run_on(deft_device dev, int nin, const ref_tensor *in, const shape_case *c, int reference,
                    size_t *bytes) {
    CHECK_OK(deft_testing_set_debug("SHAPE_REFERENCE", reference));
    deft_tensor *t = NULL;
    deft_graph *g = NULL;
    deft_status st = DEFT_OK;
    void *out = build_and_realize(dev, nin, in, build, c, &t, &g, &st);
    CHECK_MSG(out != NULL, "%s: %s", c->name, deft_errmsg());
    *bytes = t ? deft_tensor_nbytes(t) : 0;
    deft_graph_free(g);
    CHECK_OK(deft_testing_set_debug("SHAPE_REFERENCE", 0));
    return out;
}

static const shape_case cases[] = {
    {"gpt2 heads", K_PERMUTE, 4, {2, 64, 12, 64}, {0, 2, 1, 3}, 0, 0, 0},
    {"gpt2 heads back", K_PERMUTE, 4, {2, 12, 64, 64}, {0, 2, 1, 3}, 0, 0, 0},
    {"odd rows", K_PERMUTE, 4, {3, 5, 7, 9}, {2, 0, 1, 3}, 0, 0, 0},
    {"rows of 1", K_PERMUTE, 3, {5, 7, 1}, {1, 0, 2}, 0, 0, 0},
    {"rows of 3", K_PERMUTE, 4, {4, 3, 5, 3}, {3, 1, 0, 2}, 0, 0, 0},
    {"rows of 6", K_PERMUTE, 3, {9, 11, 6}, {1, 0, 2}, 0, 0, 0},
    {"rows of 24", K_PERMUTE, 5, {2, 3, 2, 5, 24}, {3, 0, 2, 1, 4}, 0, 0, 0},
    {"transpose 2d", K_PERMUTE, 2, {33, 47}, {1, 0}, 0, 0, 0},
    {"transpose small", K_PERMUTE, 2, {5, 40}, {1, 0}, 0, 0, 0},
    {"transpose batched", K_PERMUTE, 3, {3, 40, 17}, {0, 2, 1}, 0, 0, 0},
    {"transpose reversed", K_PERMUTE, 3, {20, 3, 36}, {2, 1, 0}, 0, 0, 0},
    {"transpose inner", K_PERMUTE, 4, {2, 3, 64, 48}, {0, 1, 3, 2}, 0, 0, 0},
    {"transpose mixed", K_PERMUTE, 4, {5, 70, 7, 19}, {3, 1, 2, 0}, 0, 0, 0},
    {"transpose big batch", K_PERMUTE, 3, {66000, 16, 16}, {0, 2, 1}, 0, 0, 0},   /* grid z wraps */
    {"identity", K_PERMUTE, 3, {4, 5, 6}, {0, 1, 2}, 0, 0, 0},
    {"view rows", K_VIEW_PERMUTE, 3, {5, 3, 3}, {1, 0, 2}, 0, 0, 0},
    {"view rows 8", K_VIEW_PERMUTE, 4, {3, 5, 4, 8}, {0, 2, 1, 3}, 0, 0, 0},
    {"view transpose", K_VIEW_PERMUTE, 3, {3, 33, 21}, {0, 2, 1}, 0, 0, 0},
    {"gpt2 q", K_SLICE_PERMUTE, 4, {2, 16, 4, 64}, {0, 2, 1, 3}, 2, 0, 256},
    {"gpt2 k", K_SLICE_PERMUTE, 4, {2, 16, 4, 64}, {0, 2, 1, 3}, 2, 256, 512},
    {"odd heads v", K_SLICE_PERMUTE, 4, {3, 5, 3, 7}, {0, 2, 1, 3}, 2, 42, 63},
    {"slice last odd", K_SLICE, 3, {4, 6, 37}, {0}, 2, 3, 30},
    {"slice middle", K_SLICE, 3, {4, 9, 16}, {0}, 1, 1, 8},
    {"concat last", K_CONCAT, 3, {4, 5, 0}, {0}, 2, 8, 16},
    {"concat odd", K_CONCAT, 3, {3, 7, 0}, {0}, 2, 5, 1},
    {"concat middle", K_CONCAT, 3, {3, 0, 6}, {0}, 1, 4, 7},
    {"concat first", K_CONCAT, 2, {0, 9}, {0}, 0, 2, 5},
};

static void test_cases(deft_device gpu) {
    static const deft_dtype dts[] = REF_ALL_DTYPES;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 5; d++) {
            ref_tensor in[3];
            const int nin = make_inputs(&cases[i], dts[d], in);
            size_t b_cpu = 0, b_ref = 0, b_fast = 0;
            void *cpu = run_on(deft_cpu(), nin, in, &cases[i], 0, &b_cpu);
            void *ref = run_on(gpu, nin, in, &cases[i], 1, &b_ref);
            void *fast = run_on(gpu, nin, in, &cases[i], 0, &b_fast);
            CHECK(b_cpu == b_ref && b_ref == b_fast && b_cpu > 0);
            if (cpu && ref && fast && b_cpu == b_ref && b_ref == b_fast) {
                CHECK_MSG(memcmp(cpu, ref, b_cpu) == 0, "%s %s: plain GPU kernel differs from the CPU",
                          cases[i].name, dt_names[dts[d]]);
                CHECK_MSG(memcmp(ref, fast, b_cpu) == 0, "%s %s: fast kernel differs from the plain one",
                          cases[i].name, dt_names[dts[d]]);
            }
            free(cpu);
            free(ref);
            free(fast);
            for (int k = 0; k < nin; k++) ref_free(&in[k]);
        }
}

/* ---- the GPT-2 block: x [B, T, 3C] (f32 parameter, bf16 compute) -> q, k, v heads -> (q * k + v) * w -> back ---- */
#define GB 2
#define GT 32
#define GH 4
#define GD 64

static void block_grad(deft_device dev, int reference, int adds, uint16_t *out, size_t bytes) {
    CHECK_OK(deft_testing_set_debug("SHAPE_REFERENCE", reference));
    CHECK_OK(deft_testing_set_debug("SLICE_GRAD_ADDS", adds));
    const int64_t C = GH * GD, xs[3] = {GB, GT, 3 * C}, hs[4] = {GB, GT, GH, GD};
    const int perm[4] = {0, 2, 1, 3};
    uint64_t seed = 99;
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_param(g, "x", DEFT_F32, 3, xs, dev, DEFT_INIT_ZEROS);
    float *xv = malloc((size_t)(GB * GT * 3 * C) * sizeof *xv), *wv = malloc((size_t)(GB * GT * C) * sizeof *wv);
    for (int64_t i = 0; i < GB * GT * 3 * C; i++) xv[i] = (float)ref_unif(&seed, -2, 2);
    for (int64_t i = 0; i < GB * GT * C; i++) wv[i] = i % 5 == 0 ? -0.0f : (float)ref_unif(&seed, -1, 1);
    CHECK_OK(deft_param_set(x, xv, (size_t)(GB * GT * 3 * C) * sizeof *xv));
    deft_tensor *xl = deft_cast(x, DEFT_BF16), *heads[3];
    for (int k = 0; k < 3; k++)
        heads[k] = deft_permute(deft_reshape(deft_slice(xl, 2, k * C, (k + 1) * C, 1), 4, hs), perm);
    const int64_t ws[4] = {GB, GH, GT, GD};
    deft_tensor *w = deft_cast(deft_constant(g, DEFT_F32, 4, ws, dev, wv, (size_t)(GB * GT * C) * sizeof *wv),
                               DEFT_BF16);
    deft_tensor *y = deft_mul(deft_add(deft_mul(heads[0], heads[1]), heads[2]), w);
    deft_tensor *back = deft_reshape(deft_permute(y, perm), 3, (int64_t[]){GB, GT, C});
    deft_tensor *loss = deft_sum(deft_cast(back, DEFT_F32), 0, NULL, 0);
    CHECK_OK(deft_backward(loss));
    deft_tensor *gl = deft_grad(xl);   /* bf16: the joined (or added) gradient itself */
    deft_program *p = gl ? deft_compile(g, (deft_tensor *[]){loss, gl}, 2, NULL) : NULL;
    CHECK_MSG(p != NULL, "block: compile: %s", deft_errmsg());
    if (p) {
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, gl, out, bytes));
    }
    deft_graph_free(g);
    free(xv);
    free(wv);
    CHECK_OK(deft_testing_set_debug("SHAPE_REFERENCE", 0));
    CHECK_OK(deft_testing_set_debug("SLICE_GRAD_ADDS", 0));
}

static void test_block(deft_device gpu) {
    const size_t n = (size_t)GB * GT * 3 * GH * GD, bytes = n * sizeof(uint16_t);
    uint16_t *runs[4];
    for (int r = 0; r < 4; r++) {
        runs[r] = malloc(bytes);
        memset(runs[r], 0xEE, bytes);
        block_grad(gpu, r & 1, r >> 1, runs[r], bytes);
    }
    for (int r = 1; r < 4; r++)
        CHECK_MSG(memcmp(runs[0], runs[r], bytes) == 0, "block gradient: run %d (plain %d, adds %d) differs", r,
                  r & 1, r >> 1);
    size_t neg = 0, zero = 0;
    for (size_t i = 0; i < n; i++) {
        neg += runs[0][i] == 0x8000u;
        zero += runs[0][i] == 0;
    }
    CHECK_MSG(neg == 0, "block gradient: %zu -0.0 (the adds give +0.0)", neg);
    CHECK_MSG(zero > 0, "block gradient: no zeros, so -0.0 was not exercised");
    for (int r = 0; r < 4; r++) free(runs[r]);
}

int main(void) {
    deft_device gpu;
    if (!deft_test_gpu(&gpu)) return DEFT_CHECK_SKIP;
    test_cases(gpu);
    test_block(gpu);
    return deft_check_finish();
}
