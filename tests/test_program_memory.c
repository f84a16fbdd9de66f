/* What a compiled program says about its memory: per-device footprints, the reorder option, and allocations tagged
 * with the names of the nodes they hold. */
#include <stdint.h>

#include "check.h"
#include "read_file.h"

#define CPU deft_cpu()

static void test_footprint_of_a_training_step(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){16, 8}, CPU);
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){16}, CPU);
    deft_tensor *loss = deft_cross_entropy(deft_linear(deft_relu(deft_linear(x, 32, "fc1", NULL)), 4, "fc2", NULL), y);
    CHECK_OK(deft_backward(loss));
    deft_optimizer *opt = deft_adamw(g, NULL, NULL);
    deft_program *p = deft_compile(g, (deft_tensor *[]){loss, deft_optimizer_step(opt)}, 2, NULL);
    CHECK(p != NULL);
    deft_device_footprint fp[4];
    int n = 0;
    CHECK_OK(deft_program_footprint(p, fp, 4, &n));
    CHECK(n == 1 && fp[0].device.type == DEFT_CPU);
    size_t params = (8 * 32 + 32 + 32 * 4 + 4) * sizeof(float);
    size_t inputs = 16 * 8 * sizeof(float) + 16 * sizeof(int32_t);
    /* AdamW keeps the flat gradients and two moments beside the parameters; backward starts from a constant 1. */
    size_t expected = params + inputs + 3 * params + sizeof(float);
    CHECK_MSG(fp[0].persistent_bytes == expected, "persistent %zu, expected %zu", fp[0].persistent_bytes, expected);
    deft_memory_report r;
    CHECK_OK(deft_program_memory(p, &r));
    CHECK(fp[0].arena_bytes == r.arena_bytes && fp[0].persistent_bytes == r.persistent_bytes);
    CHECK(fp[0].workspace_bytes == 0);
    CHECK(fp[0].total_bytes == fp[0].persistent_bytes + fp[0].arena_bytes);
    CHECK_ERR(deft_program_footprint(p, fp, 0, &n), DEFT_ERR_INVALID, "bad argument");
    deft_graph_free(g);
}

/* Two independent branches built interleaved: in id order both large temporaries are live together; reordered,
 * each branch finishes before the other starts. */
static void test_reorder_lowers_the_peak(void) {
    const int64_t n = 4096;
    float *xs = malloc((size_t)n * sizeof *xs);
    for (int64_t i = 0; i < n; i++) xs[i] = (float)(i % 17) * 0.01f;
    float results[2][2];
    size_t arenas[2];
    for (int reorder = 0; reorder < 2; reorder++) {
        deft_graph *g = deft_graph_new();
        deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, &n, CPU);
        deft_tensor *a = deft_exp(x), *b = deft_tanh(x);
        deft_tensor *sa = deft_sum(a, 0, NULL, 0), *sb = deft_sum(b, 0, NULL, 0);
        deft_program *p = deft_compile(g, (deft_tensor *[]){sa, sb}, 2, &(deft_compile_options){.reorder = reorder});
        CHECK(p != NULL);
        CHECK_OK(deft_program_feed(p, x, xs, (size_t)n * sizeof *xs));
        CHECK_OK(deft_program_run(p));
        CHECK_OK(deft_program_read(p, sa, &results[reorder][0], sizeof(float)));
        CHECK_OK(deft_program_read(p, sb, &results[reorder][1], sizeof(float)));
        deft_memory_report r;
        CHECK_OK(deft_program_memory(p, &r));
        arenas[reorder] = r.arena_bytes;
        deft_graph_free(g);
    }
    CHECK_MSG(arenas[1] < arenas[0], "reordered arena %zu, in order %zu", arenas[1], arenas[0]);
    CHECK(arenas[1] <= (size_t)n * sizeof(float) + 2 * 256);
    CHECK(results[0][0] == results[1][0] && results[0][1] == results[1][1]);
    free(xs);
}

static void test_allocations_are_tagged(void) {
    CHECK_OK(deft_memory_record_history(1000));
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "images_in", DEFT_F32, 2, (int64_t[]){4, 4}, CPU);
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){4, 4}, CPU, DEFT_INIT_KAIMING);
    CHECK_OK(deft_backward(deft_sum(deft_matmul(x, w), 0, NULL, 0)));
    deft_optimizer *opt = deft_sgd(g, &(deft_sgd_options){.lr = 0.1}, NULL);
    deft_program *p = deft_compile(g, (deft_tensor *[]){deft_optimizer_step(opt)}, 1, NULL);
    CHECK(p != NULL);
    const char *path = "test_program_memory_snapshot.json";
    CHECK_OK(deft_memory_snapshot(path));
    char *json = read_file(path);
    CHECK(json != NULL);
    if (json) {
        CHECK_MSG(strstr(json, "\"images_in\"") != NULL, "the input's slot is not tagged with its name");
        CHECK_MSG(strstr(json, "\"arena cpu\"") != NULL, "the arena is not tagged");
        CHECK_MSG(strstr(json, "\"optimizer.state\"") != NULL, "the optimizer state is not tagged");
    }
    free(json);
    remove(path);
    deft_graph_free(g);
    CHECK_OK(deft_memory_record_history(0));
}

int main(void) {
    test_footprint_of_a_training_step();
    test_reorder_lowers_the_peak();
    test_allocations_are_tagged();
    return deft_check_finish();
}
