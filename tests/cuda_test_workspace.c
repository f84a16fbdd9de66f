/* cuBLAS and cuDNN scratch per stream (mem/cuda_workspace.cu): a program's footprint names the workspaces its
 * steps use (cuBLAS's for products, cuDNN's for convolutions); each program's stream gets its own from the caching
 * allocator on its first run, and gives it back when the program is freed. */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "deft_testing.h"

#define GPU deft_cuda(0)

static deft_program *matmul_program(deft_graph *g, deft_tensor **y) {
    deft_tensor *x = deft_full(g, DEFT_F32, 2, (int64_t[]){64, 256}, GPU, 0.5);
    *y = deft_linear(x, 256, NULL, NULL);
    return deft_compile(g, y, 1, NULL);
}

static deft_program *conv_program(deft_graph *g, deft_tensor **y) {
    deft_tensor *x = deft_full(g, DEFT_F32, 4, (int64_t[]){2, 3, 8, 8}, GPU, 0.25);
    deft_tensor *w = deft_full(g, DEFT_F32, 4, (int64_t[]){4, 3, 3, 3}, GPU, 0.5);
    *y = deft_conv2d(x, w, NULL, &(deft_conv2d_options){.padding = {1, 1}});
    return deft_compile(g, y, 1, NULL);
}

static size_t workspace_of(deft_program *p) {
    deft_device_footprint fp[2];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 2, &n));
    CHECK(n == 1);
    return n == 1 ? fp[0].workspace_bytes : 0;
}

static int64_t allocated_now(void) {
    deft_memory_stats st;
    CHECK_OK(deft_memory_stats_get(GPU, &st));
    return st.allocated_bytes.current;
}

static void test_footprints(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *ym, *yc;
    deft_program *pm = matmul_program(g, &ym), *pc = conv_program(g, &yc);
    CHECK_MSG(pm && pc, "compile: %s", deft_errmsg());
    if (pm) CHECK(workspace_of(pm) == DEFT_CUBLAS_WORKSPACE_BYTES);
    if (pc) CHECK(workspace_of(pc) == DEFT_CUDNN_WORKSPACE_BYTES);
    deft_tensor *both = deft_add(deft_sum(ym, 0, NULL, 0), deft_sum(yc, 0, NULL, 0));
    deft_program *pb = deft_compile(g, &both, 1, NULL);
    CHECK_MSG(pb != NULL, "compile: %s", deft_errmsg());
    if (pb) CHECK(workspace_of(pb) == DEFT_CUBLAS_WORKSPACE_BYTES + DEFT_CUDNN_WORKSPACE_BYTES);
    deft_graph_free(g);
}

/* Each program's first run takes its stream's scratch; freeing the program gives it back. */
static void test_scratch_per_stream(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *y1, *y2;
    deft_program *p1 = matmul_program(g, &y1), *p2 = matmul_program(g, &y2);
    CHECK_MSG(p1 && p2, "compile: %s", deft_errmsg());
    if (!p1 || !p2) {
        deft_graph_free(g);
        return;
    }
    static float before[64 * 256], after[64 * 256], other[64 * 256];
    CHECK_OK(deft_program_run(p1));
    CHECK_OK(deft_program_run(p2));
    CHECK_OK(deft_program_read(p1, y1, before, sizeof before));
    CHECK_OK(deft_program_read(p2, y2, other, sizeof other));
    const int64_t with_both = allocated_now();
    deft_program_free(p2);
    const int64_t after_free = allocated_now();
    CHECK_MSG(with_both - after_free >= (int64_t)DEFT_CUBLAS_WORKSPACE_BYTES,
              "freeing a program gave back %lld bytes, less than its %zu-byte cuBLAS scratch",
              (long long)(with_both - after_free), (size_t)DEFT_CUBLAS_WORKSPACE_BYTES);
    CHECK_OK(deft_program_run(p1));   /* the other program's scratch is still its own */
    CHECK_OK(deft_program_read(p1, y1, after, sizeof after));
    CHECK(memcmp(before, after, sizeof before) == 0);
    CHECK(before[0] == before[0] && before[0] != 0.0f);
    deft_graph_free(g);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_footprints();
    test_scratch_per_stream();
    return deft_check_finish();
}
