/* Device mismatches fail when the op is built, naming both devices; an explicit deft_to is the way across. An arena
 * larger than the GPU's free memory fails when compiling, with the numbers, and the device stays usable. */
#include "check.h"

static void test_arena_larger_than_the_gpu(void) {
    size_t free_b = 0, total = 0;
    CHECK_OK(deft_device_memory(deft_cuda(0), &free_b, &total));
    deft_graph *g = deft_graph_new();
    int64_t n = (int64_t)(total / sizeof(float) / 2 + 1);   /* two such buffers live together: more than the GPU */
    deft_tensor *a = deft_full(g, DEFT_F32, 1, &n, deft_cuda(0), 1.0);
    deft_tensor *b = deft_exp(a);
    deft_tensor *s = deft_add(deft_sum(a, 0, NULL, 0), deft_sum(deft_add(a, b), 0, NULL, 0));
    deft_program *p = NULL;
    deft_memory_report r;
    CHECK_OK(deft_plan_memory(g, &s, 1, NULL, &r));
    CHECK(r.arena_bytes > total);
    p = deft_compile(g, &s, 1, NULL);
    CHECK(p == NULL);
    CHECK_MSG(strstr(deft_errmsg(), "does not fit on cuda:0") != NULL, "message: %s", deft_errmsg());
    deft_memory_stats st;
    CHECK_OK(deft_memory_stats_get(deft_cuda(0), &st));
    CHECK(st.num_ooms == 0);   /* refused by the plan check, before the allocator was asked */
    deft_graph_free(g);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    deft_graph *g = deft_graph_new();
    deft_tensor *c = deft_full(g, DEFT_F32, 2, (int64_t[]){2, 2}, deft_cpu(), 1.0);
    deft_tensor *d = deft_full(g, DEFT_F32, 2, (int64_t[]){2, 2}, deft_cuda(0), 2.0);
    CHECK_NULL_ERR(deft_add(c, d), "add: expected all tensors on the same device, found cpu and cuda:0");
    CHECK_NULL_ERR(deft_matmul(d, c), "matmul: expected all tensors on the same device, found cuda:0 and cpu");
    CHECK_NULL_ERR(deft_concat((deft_tensor *[]){d, d, c}, 3, 0), "found cuda:0 and cpu");
    CHECK(deft_graph_error(g) == DEFT_ERR_DEVICE);
    deft_graph_free(g);

    g = deft_graph_new();
    c = deft_full(g, DEFT_F32, 2, (int64_t[]){2, 2}, deft_cpu(), 1.0);
    d = deft_full(g, DEFT_F32, 2, (int64_t[]){2, 2}, deft_cuda(0), 2.0);
    deft_tensor *sum = deft_add(deft_to(c, deft_cuda(0), DEFT_F32), d);
    deft_tensor *back = deft_to(sum, deft_cpu(), DEFT_F64);
    CHECK(deft_tensor_device(back).type == DEFT_CPU && deft_tensor_dtype(back) == DEFT_F64);
    double v[4];
    CHECK_OK(deft_realize(back, v, sizeof v));
    for (int i = 0; i < 4; i++) CHECK(v[i] == 3.0);
    deft_device bad;
    CHECK_ERR(deft_device_parse("cuda:4096", &bad), DEFT_ERR_DEVICE, "cuda:4096 does not exist");
    CHECK_NULL_ERR(deft_full(g, DEFT_F32, 1, (int64_t[]){1}, deft_cuda(4096), 0.0), "cuda:4096 does not exist");
    deft_graph_free(g);
    test_arena_larger_than_the_gpu();
    return deft_check_finish();
}
