/* deft_attention_packed on the CPU (ops/cpu/cpu_attention.c) against the composition it replaces (q, k, v sliced out
 * of qkv [B, T, 3C], reshaped and permuted to [B, H, T, D], deft_attention, the output permuted back: what
 * examples/gpt2.h built), f32 and f64, causal and not, H = 1, D odd, T off the kernel's tile of 16 and T = 1:
 *   - the output and qkv's gradient are equal value for value (==, so bit for bit up to the sign of a zero): both
 *     forms run the one CPU kernel, which reads rows through strides and sums in the same order whatever the
 *     layout, and the apart form's slices, permutes and concat only copy;
 *   - the same under bf16 autocast (qkv's product cast once, the same kernel on bf16 storage);
 *   - qkv's gradient against central finite differences in f64 (tests/grad_check.h);
 *   - the graph: one attention node with qkv as its only source and one gradient node [B, T, 3C] that is qkv's
 *     gradient itself (no slice, permute or concat); checkpointing drops and recomputes the packed node at the
 *     apart node's FLOPs (4 B H T^2 D, half causal) and gives the same gradient bits;
 *   - refusals (heads not dividing C, a 2-D input, a last dim not divisible by 3, D past 128, heads < 1, an integer
 *     dtype, a NaN scale, NULL) fail with DEFT_ERR_SHAPE / DEFT_ERR_INVALID / DEFT_ERR_DTYPE naming the op and the
 *     shape, and leave the graph as it was. */
#include <string.h>

#include "check.h"
#include "ref.h"
#include "grad_check.h"
#include "attention_packed_run.h"
#include "deft_testing.h"

static uint64_t rng = 0x9ac4edull;

static const pk_shape shapes[] = {
    {1, 5, 1, 3, 0, 0},  {2, 19, 3, 5, 0, 0}, {2, 33, 2, 8, 0, 0.3}, {1, 1, 2, 4, 0, 0},
    {1, 40, 1, 17, 0, 0}, {3, 16, 4, 2, 0, 0},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void equal_case(const pk_shape *s, deft_dtype dt, const deft_compile_options *opts) {
    double *qkv, *r;
    pk_random(&rng, s, dt, 1.5, &qkv, &r);
    pk_result a = {0}, p = {0};
    const int ok = pk_run(s, 0, dt, deft_cpu(), opts, qkv, r, &a) && pk_run(s, 1, dt, deft_cpu(), opts, qkv, r, &p);
    if (ok) {
        const int64_t n = pk_numel_y(s), dy = pk_differ(p.y, a.y, n), dg = pk_differ(p.dqkv, a.dqkv, 3 * n);
        CHECK_MSG(dy == 0 && dg == 0, "%s%s B %lld T %lld H %lld D %lld causal %d: %lld of %lld outputs and %lld of "
                  "%lld gradients differ", deft_dtype_name(dt), opts && opts->autocast ? " autocast bf16" : "",
                  (long long)s->b, (long long)s->t, (long long)s->h, (long long)s->d, s->causal, (long long)dy,
                  (long long)n, (long long)dg, (long long)(3 * n));
        /* not a comparison of zeros: the gradient reaches every part of qkv */
        double mag[3] = {0, 0, 0};
        const int64_t c = pk_c(s);
        for (int64_t i = 0; i < 3 * n; i++) mag[i % (3 * c) / c] = fmax(mag[i % (3 * c) / c], fabs(p.dqkv[i]));
        CHECK_MSG(mag[2] > 0 && ((mag[0] > 0 && mag[1] > 0) || s->t == 1), "gradient magnitudes q %g k %g v %g",
                  mag[0], mag[1], mag[2]);
    }
    pk_result_free(&a);
    pk_result_free(&p);
    free(qkv);
    free(r);
}

static void test_equal(void) {
    const deft_dtype dts[2] = {DEFT_F32, DEFT_F64};
    for (size_t i = 0; i < N_SHAPES; i++)
        for (int causal = 0; causal < 2; causal++)
            for (int k = 0; k < 2; k++) {
                pk_shape s = shapes[i];
                s.causal = causal;
                equal_case(&s, dts[k], NULL);
            }
    const deft_compile_options bf16 = {.autocast = DEFT_BF16};
    const pk_shape s = {2, 21, 2, 8, 1, 0};
    equal_case(&s, DEFT_F32, &bf16);
}

static void test_finite_differences(void) {
    for (int causal = 0; causal < 2; causal++) {
        const int64_t shape[3] = {2, 19, 3 * 2 * 3};   /* H = 2, D = 3; 19 rows: a full tile and a partial one */
        deft_graph *g = deft_graph_new();
        deft_tensor *qkv = grad_check_param(g, &rng, 0, 3, shape, -1.5, 1.5);
        const deft_attention_options o = {.causal = causal, .scale = causal ? 0.7 : 0.0};
        char name[64];
        snprintf(name, sizeof name, "packed finite differences causal %d", causal);
        grad_check_case(name, g, &rng, deft_attention_packed(qkv, 2, &o), &qkv, 1, NULL, NULL, 0, 1e-6);
        deft_graph_free(g);
    }
}

/* The nodes: attention reads qkv alone, its gradient node is qkv's gradient ([B, T, 3C]) and reads (dy, qkv, y). */
static void test_graph(void) {
    deft_graph *g = deft_graph_new();
    const int64_t shape[3] = {2, 7, 3 * 12};
    deft_tensor *qkv = deft_param(g, "qkv", DEFT_F32, 3, shape, deft_cpu(), DEFT_INIT_ZEROS);
    deft_tensor *y = deft_attention_packed(qkv, 3, &(deft_attention_options){.causal = 1});
    CHECK_MSG(y && deft_tensor_ndim(y) == 3 && deft_tensor_dim(y, 0) == 2 && deft_tensor_dim(y, 1) == 7 &&
                  deft_tensor_dim(y, 2) == 12 && !strcmp(deft_testing_op(y), "attention"),
              "attention_packed on [2, 7, 36]: %s", deft_errmsg());
    CHECK_OK(deft_backward(deft_sum(y, 0, NULL, 0)));
    const deft_tensor *gq = deft_grad(qkv);
    CHECK_MSG(gq && !strcmp(deft_testing_op(gq), "attention_grad") && deft_tensor_ndim(gq) == 3 &&
                  deft_tensor_dim(gq, 2) == 36,
              "qkv's gradient is %s, not the attention gradient node", gq ? deft_testing_op(gq) : "missing");
    int slices = 0, permutes = 0, concats = 0;
    for (int id = 0; id < deft_graph_node_count(g); id++) {
        const char *op = deft_testing_op(deft_testing_node(g, id));
        slices += !strcmp(op, "slice"), permutes += !strcmp(op, "permute"), concats += !strcmp(op, "concat");
    }
    CHECK_MSG(slices == 0 && permutes == 0 && concats == 0, "%d slices, %d permutes, %d concats", slices, permutes,
              concats);
    deft_graph_free(g);
}

/* Checkpointing drops the packed node and recomputes it (the op cost: 4 B H T^2 D FLOPs, half when causal, as the
 * apart node's), its statistics with it; qkv's gradient is the same bits. */
static void test_checkpoint(void) {
    const pk_shape s = {2, 21, 2, 8, 1, 0};
    const int64_t c = pk_c(&s), n = pk_numel_y(&s), shape[3] = {s.b, s.t, 3 * c}, yshape[3] = {s.b, s.t, c};
    double *qkv, *r;
    pk_random(&rng, &s, DEFT_F64, 1.0, &qkv, &r);
    double *grads[2] = {NULL, NULL};
    for (int ck = 0; ck < 2; ck++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *p = deft_param(g, "qkv", DEFT_F64, 3, shape, deft_cpu(), DEFT_INIT_ZEROS);
        CHECK_OK(deft_param_set(p, qkv, (size_t)(3 * n) * sizeof(double)));
        deft_tensor *a = deft_tanh(p);
        deft_tensor *o = deft_attention_packed(a, (int)s.h, &(deft_attention_options){.causal = 1});
        deft_tensor *y = deft_tanh(o);
        deft_tensor *rt = deft_constant(g, DEFT_F64, 3, yshape, deft_cpu(), r, (size_t)n * sizeof(double));
        deft_tensor *loss = deft_sum(deft_mul(y, rt), 0, NULL, 0);
        CHECK_OK(deft_backward(loss));
        if (ck) CHECK_OK(deft_checkpoint_span(a, y));   /* marks o alone */
        deft_tensor *outs[2] = {loss, deft_grad(p)};
        deft_compile_options opts = {.checkpoint = ck ? DEFT_CHECKPOINT_MARKED : DEFT_CHECKPOINT_NONE};
        deft_program *prog = deft_compile(g, outs, 2, &opts);
        CHECK_MSG(prog != NULL, "compile: %s", deft_errmsg());
        if (prog) {
            CHECK_OK(deft_program_run(prog));
            grads[ck] = ref_read_program(prog, outs[1], 3 * n);
        }
        if (prog && ck) {
            ref_check_one_recompute(prog, 4.0 * s.b * s.h * s.t * s.t * s.d * 0.5);   /* causal: half */
        }
        deft_graph_free(g);
    }
    if (grads[0] && grads[1])
        CHECK_MSG(pk_differ(grads[1], grads[0], 3 * n) == 0, "checkpointed gradient differs");
    free(grads[0]);
    free(grads[1]);
    free(qkv);
    free(r);
}

/* One refused call on a fresh graph holding only its input: the status, the message and no node added. */
static void refuse(int ndim, const int64_t *shape, deft_dtype dt, int heads, const deft_attention_options *o,
                   deft_status want, const char *needle) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "qkv", dt, ndim, shape, deft_cpu());
    const int nodes = deft_graph_node_count(g);
    CHECK_NULL_ERR(deft_attention_packed(x, heads, o), needle);
    CHECK_MSG(deft_graph_error(g) == want, "%s: status %s, wanted %s", needle, deft_status_name(deft_graph_error(g)),
              deft_status_name(want));
    CHECK_MSG(deft_graph_node_count(g) == nodes, "%s: refused call added nodes: %d -> %d", needle, nodes,
              deft_graph_node_count(g));
    deft_graph_free(g);
}

static void test_refusals(void) {
    const int64_t ok[3] = {2, 4, 18}, flat[2] = {4, 18}, ten[3] = {2, 4, 10}, wide[3] = {1, 2, 3 * 258};
    refuse(3, ok, DEFT_F32, 4, NULL, DEFT_ERR_SHAPE, "attention_packed: qkv [2, 4, 18]: C = 6 is not divisible by 4");
    refuse(2, flat, DEFT_F32, 2, NULL, DEFT_ERR_SHAPE, "attention_packed: qkv must be [B, T, 3C]");
    refuse(3, ten, DEFT_F32, 2, NULL, DEFT_ERR_SHAPE, "got [2, 4, 10]");
    refuse(3, wide, DEFT_F32, 2, NULL, DEFT_ERR_SHAPE, "head size D = 129");
    refuse(3, ok, DEFT_F32, 0, NULL, DEFT_ERR_INVALID, "heads 0 must be positive");
    refuse(3, ok, DEFT_I32, 2, NULL, DEFT_ERR_DTYPE, "needs a floating dtype");
    refuse(3, ok, DEFT_F32, 2, &(deft_attention_options){.scale = NAN}, DEFT_ERR_INVALID, "scale nan must be finite");
    CHECK_NULL_ERR(deft_attention_packed(NULL, 2, NULL), "");
    /* what the builder takes: D = 128, one head */
    deft_graph *g = deft_graph_new();
    deft_tensor *big = deft_input(g, "big", DEFT_BF16, 3, (int64_t[]){1, 3, 3 * 128}, deft_cpu());
    deft_tensor *t = deft_attention_packed(big, 1, NULL);
    CHECK_MSG(t && deft_tensor_dtype(t) == DEFT_BF16 && deft_tensor_dim(t, 2) == 128, "bf16 [1, 3, 384]: %s",
              deft_errmsg());
    deft_graph_free(g);
}

int main(void) {
    test_equal();
    test_finite_differences();
    test_graph();
    test_checkpoint();
    test_refusals();
    return deft_check_finish();
}
