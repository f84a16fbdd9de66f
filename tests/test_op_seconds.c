/* The roofline the checkpoint search weighs recomputation with (ir/op_cost.c's deft_op_seconds): bf16 and f16
 * products and attention on a GPU run at the tensor cores' rate, ten times the CUDA cores'; the same nodes in f32, on
 * the CPU, or elementwise work never do; and each node's time is the larger of its operations' and its bytes' (a
 * product over a short inner dimension stays bound by its bytes on either rate). Runs on the CPU: the GPU's nodes
 * are copies of the CPU's that claim cuda:0. */
#include "check.h"
#include "deft_testing.h"

typedef struct timed {
    double cpu, gpu;   /* seconds, the node on the CPU and claiming cuda:0 */
    double flops, bytes;
} timed;

static timed time_both(const deft_tensor *t) {
    timed r = {0};
    CHECK_MSG(t != NULL, "building: %s", deft_errmsg());
    if (!t) return r;
    r.cpu = deft_testing_op_seconds(t, &r.flops, &r.bytes);
    deft_tensor *on_gpu = deft_testing_node_copy_on(t, deft_cuda(0));
    CHECK_MSG(on_gpu != NULL, "copying the node");
    if (!on_gpu) return r;
    double f, b;
    r.gpu = deft_testing_op_seconds(on_gpu, &f, &b);
    CHECK_MSG(f == r.flops && b == r.bytes, "the device changed the work: %g %g against %g %g", f, b, r.flops,
              r.bytes);
    deft_testing_node_copy_free(on_gpu);
    return r;
}

static deft_tensor *input(deft_graph *g, const char *name, deft_dtype dt, int64_t rows, int64_t cols) {
    return deft_input(g, name, dt, 2, (int64_t[]){rows, cols}, deft_cpu());
}

/* [1024, 768] x [768, 3072]: 4.8 GFLOP over 12.6 MB, bound by its operations on both rates. */
static void test_products(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *a16 = input(g, "a16", DEFT_BF16, 1024, 768), *w16 = input(g, "w16", DEFT_BF16, 768, 3072);
    deft_tensor *a32 = input(g, "a32", DEFT_F32, 1024, 768), *w32 = input(g, "w32", DEFT_F32, 768, 3072);
    deft_tensor *h16 = input(g, "h16", DEFT_F16, 1024, 768), *v16 = input(g, "v16", DEFT_F16, 768, 3072);
    const timed bf16 = time_both(deft_matmul(a16, w16)), f32 = time_both(deft_matmul(a32, w32));
    const timed f16 = time_both(deft_matmul(h16, v16));
    CHECK_NEAR(bf16.flops, 2.0 * 1024 * 768 * 3072, 0.5);
    CHECK_MSG(bf16.cpu > 0 && f32.cpu > 0, "no time: %g %g", bf16.cpu, f32.cpu);
    CHECK_NEAR(bf16.cpu / bf16.gpu, 10.0, 1e-9);
    CHECK_NEAR(f16.cpu / f16.gpu, 10.0, 1e-9);
    CHECK_NEAR(f32.gpu, f32.cpu, 0.0);
    CHECK_NEAR(bf16.cpu, f32.cpu, 0.0);   /* the same operations, bound by them, off the tensor cores */
    deft_graph_free(g);
}

/* [16384, 8] x [8, 16384]: 4.3 GFLOP but 537 MB of output, bound by its bytes whatever the rate. */
static void test_short_inner_dimension(void) {
    deft_graph *g = deft_graph_new();
    const timed t = time_both(deft_matmul(input(g, "a", DEFT_BF16, 16384, 8), input(g, "b", DEFT_BF16, 8, 16384)));
    CHECK_NEAR(t.gpu, t.cpu, 0.0);
    CHECK_MSG(t.bytes >= 16384.0 * 16384 * 2, "bytes %g: the output alone is more", t.bytes);
    deft_graph_free(g);
}

/* Attention (1 x 1 x 1024 x 64, not causal: 268 MFLOP over 0.5 MB) on the tensor cores in bf16, not in f32;
 * GELU over a bf16 [1024, 3072] never, bound by its bytes. */
static void test_attention_and_elementwise(void) {
    deft_graph *g = deft_graph_new();
    int64_t shape[4] = {1, 1, 1024, 64};
    deft_tensor *q = deft_input(g, "q", DEFT_BF16, 4, shape, deft_cpu());
    deft_tensor *k = deft_input(g, "k", DEFT_BF16, 4, shape, deft_cpu());
    deft_tensor *v = deft_input(g, "v", DEFT_BF16, 4, shape, deft_cpu());
    deft_tensor *q32 = deft_input(g, "q32", DEFT_F32, 4, shape, deft_cpu());
    deft_tensor *k32 = deft_input(g, "k32", DEFT_F32, 4, shape, deft_cpu());
    deft_tensor *v32 = deft_input(g, "v32", DEFT_F32, 4, shape, deft_cpu());
    const timed att = time_both(deft_attention(q, k, v, &(deft_attention_options){0}));
    const timed att32 = time_both(deft_attention(q32, k32, v32, &(deft_attention_options){0}));
    CHECK_NEAR(att.cpu / att.gpu, 10.0, 1e-9);
    CHECK_NEAR(att32.gpu, att32.cpu, 0.0);
    const timed gelu = time_both(deft_gelu(input(g, "x", DEFT_BF16, 1024, 3072)));
    CHECK_NEAR(gelu.gpu, gelu.cpu, 0.0);
    CHECK_NEAR(gelu.gpu * 2e12, gelu.bytes, 1e-6 * gelu.bytes);
    deft_graph_free(g);
}

int main(void) {
    test_products();
    test_short_inner_dimension();
    test_attention_and_elementwise();
    return deft_check_finish();
}
