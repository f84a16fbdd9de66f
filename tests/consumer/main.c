/* A user's program against an installed deft: builds a tiny graph, realizes it and checks the numbers.
 * Only <deft.h> is included; exit status 0 when every value is right. Runs on the CPU, and also on the default
 * device when that is a GPU. */
#include <deft.h>

#include <math.h>
#include <stdio.h>

static int check(const char *what, const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(got[i] - want[i]) > 1e-5f) {
            fprintf(stderr, "%s[%d] = %g, expected %g\n", what, i, (double)got[i], (double)want[i]);
            bad = 1;
        }
    }
    return bad;
}

static int run_on(deft_device dev) {
    char name[32];
    deft_device_str(dev, name, sizeof name);
    const float a_data[4] = {1, -2, 3, -4};
    const float b_data[4] = {10, 20, 30, 40};
    const int64_t shape[2] = {2, 2};

    deft_graph *g = deft_graph_new();
    if (!g) {
        fprintf(stderr, "deft_graph_new: %s\n", deft_errmsg());
        return 1;
    }
    deft_tensor *a = deft_constant(g, DEFT_F32, 2, shape, dev, a_data, sizeof a_data);
    deft_tensor *b = deft_constant(g, DEFT_F32, 2, shape, dev, b_data, sizeof b_data);
    deft_tensor *sum = deft_add(a, b);                  /* {11, 18, 33, 36} */
    deft_tensor *prod = deft_relu(deft_matmul(b, a));   /* relu({70, -100, 150, -220}) */
    deft_tensor *prod2 = deft_matmul(a, b);             /* {-50, -60, -90, -100} */
    if (!sum || !prod || !prod2) {
        fprintf(stderr, "%s: building failed: %s\n", name, deft_errmsg());
        deft_graph_free(g);
        return 1;
    }

    float got[4];
    int bad = 0;
    deft_status s = deft_realize(sum, got, sizeof got);
    if (s != DEFT_OK) {
        fprintf(stderr, "%s: deft_realize(add): %s: %s\n", name, deft_status_name(s), deft_errmsg());
        bad = 1;
    } else {
        bad |= check("add", got, (const float[]){11, 18, 33, 36}, 4);
    }
    s = deft_realize(prod, got, sizeof got);
    if (s != DEFT_OK) {
        fprintf(stderr, "%s: deft_realize(relu(b@a)): %s: %s\n", name, deft_status_name(s), deft_errmsg());
        bad = 1;
    } else {
        bad |= check("relu(b@a)", got, (const float[]){70, 0, 150, 0}, 4);
    }
    s = deft_realize(prod2, got, sizeof got);
    if (s != DEFT_OK) {
        fprintf(stderr, "%s: deft_realize(a@b): %s: %s\n", name, deft_status_name(s), deft_errmsg());
        bad = 1;
    } else {
        bad |= check("a@b", got, (const float[]){-50, -60, -90, -100}, 4);
    }
    deft_graph_free(g);
    printf("deft_consumer: %s: %s\n", name, bad ? "WRONG" : "ok");
    return bad;
}

int main(void) {
    printf("deft_consumer: deft %s, CUDA build %d, BLAS %d\n", deft_version(), deft_has_cuda_build(),
           deft_has_blas());
    int bad = run_on(deft_cpu());
    deft_device dev = deft_device_default();
    if (!deft_device_equal(dev, deft_cpu())) bad |= run_on(dev);
    return bad;
}
