/* The image ops have no CUDA kernels yet: on a GPU each one builds, and running it fails with DEFT_ERR_DEVICE and a
 * message naming the op, never a crash; the device stays usable. A graph that runs them on the CPU and moves the
 * result to the GPU works and agrees with the all-CPU graph. */
#include "check.h"

#define GPU deft_cuda(0)

/* Builds op(x) on cuda:0 for each image op and checks the run's error. */
static void test_ops_refused(void) {
    const char *names[] = {"conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "bn_stats"};
    for (int k = 0; k < 5; k++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = deft_full(g, DEFT_F32, 4, (int64_t[]){2, 3, 8, 8}, GPU, 1.0), *y = NULL;
        switch (k) {
        case 0: y = deft_conv2d(x, deft_full(g, DEFT_F32, 4, (int64_t[]){4, 3, 3, 3}, GPU, 0.5), NULL, NULL); break;
        case 1: y = deft_max_pool2d(x, &(deft_pool2d_options){.kernel = {2, 2}}); break;
        case 2: y = deft_avg_pool2d(x, &(deft_pool2d_options){.kernel = {2, 2}}); break;
        case 3: y = deft_adaptive_avg_pool2d(x, 1, 1, DEFT_NCHW); break;
        default: y = deft_batch_norm_layer(x, "bn", NULL); break;
        }
        CHECK_MSG(y != NULL, "%s builds on cuda:0: %s", names[k], deft_errmsg());
        deft_program *p = y ? deft_compile(g, &y, 1, NULL) : NULL;
        if (p) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s is not implemented on CUDA yet", names[k]);
            CHECK_ERR(deft_program_run(p), DEFT_ERR_DEVICE, msg);
        } else {
            /* refusing at compile is as good, provided it names the op */
            CHECK_MSG(strstr(deft_errmsg(), names[k]) != NULL, "compile: %s", deft_errmsg());
        }
        deft_graph_free(g);
    }
}

static void test_cpu_conv_feeds_the_gpu(void) {
    float x[2 * 2 * 5 * 5], w[3 * 2 * 3 * 3];
    for (int i = 0; i < 50 * 2; i++) x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 54; i++) w[i] = (float)((i * 13) % 7) / 7.0f - 0.5f;
    float want[3 * 2 * 5 * 5], got[3 * 2 * 5 * 5];
    for (int gpu = 0; gpu < 2; gpu++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *xt = deft_constant(g, DEFT_F32, 4, (int64_t[]){2, 2, 5, 5}, deft_cpu(), x, sizeof x);
        deft_tensor *wt = deft_constant(g, DEFT_F32, 4, (int64_t[]){3, 2, 3, 3}, deft_cpu(), w, sizeof w);
        deft_tensor *y = deft_conv2d(xt, wt, NULL, &(deft_conv2d_options){.padding = {1, 1}});
        if (gpu) y = deft_to(deft_relu(deft_to(y, GPU, DEFT_F32)), deft_cpu(), DEFT_F32);
        else y = deft_relu(y);
        CHECK_OK(deft_realize(y, gpu ? got : want, sizeof got));
        deft_graph_free(g);
    }
    for (int i = 0; i < 150; i++) CHECK_MSG(got[i] == want[i], "[%d] %g vs %g", i, got[i], want[i]);
}

int main(void) {
    if (deft_cuda_device_count() == 0) {
        printf("no GPU: skipped\n");
        return 77;
    }
    test_ops_refused();
    test_cpu_conv_feeds_the_gpu();
    /* the device is still usable */
    deft_graph *g = deft_graph_new();
    deft_tensor *s = deft_sum(deft_full(g, DEFT_F32, 1, (int64_t[]){1000}, GPU, 2.0), 0, NULL, 0);
    float v = 0.0f;
    CHECK_OK(deft_realize(s, &v, sizeof v));
    CHECK(v == 2000.0f);
    deft_graph_free(g);
    return deft_check_finish();
}
