/* examples/gpt2.h's gpt2_build_shapes_into, which deft_largest_batch's probes in bench_gpt2 build: the same graph as
 * gpt2_build_into, node for node (ops, shapes, names), and the same plan, with the parameters left undrawn (the
 * normal draws were most of a probe's time at GPT-2 124M). */
#include <string.h>

#include "../examples/gpt2.h"
#include "check.h"
#include "deft_testing.h"

static const gpt2_config tiny = {64, 16, 32, 2, 4};

static deft_graph *build(int shapes_only, gpt2 *m) {
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, 5);
    const deft_status s = shapes_only ? gpt2_build_shapes_into(m, g, &tiny, 3, deft_cpu())
                                      : gpt2_build_into(m, g, &tiny, 3, deft_cpu());
    CHECK_MSG(s == DEFT_OK, "build (shapes_only %d): %s", shapes_only, deft_errmsg());
    CHECK_OK(deft_backward(m->loss));
    return g;
}

int main(void) {
    gpt2 full, shapes;
    deft_graph *a = build(0, &full), *b = build(1, &shapes);
    const int n = deft_graph_node_count(a);
    CHECK_MSG(n > 0 && n == deft_graph_node_count(b), "%d nodes against %d", n, deft_graph_node_count(b));
    for (int id = 0; id < n && n == deft_graph_node_count(b); id++) {
        const deft_tensor *x = deft_testing_node(a, id), *y = deft_testing_node(b, id);
        const int nd = deft_tensor_ndim(x);
        CHECK_MSG(!strcmp(deft_testing_op(x), deft_testing_op(y)) && nd == deft_tensor_ndim(y) &&
                      !memcmp(deft_testing_shape(x), deft_testing_shape(y), (size_t)nd * sizeof(int64_t)) &&
                      !strcmp(deft_tensor_name(x), deft_tensor_name(y)),
                  "node %d: %s %s against %s %s", id, deft_testing_op(x), deft_tensor_name(x), deft_testing_op(y),
                  deft_tensor_name(y));
    }
    deft_memory_report ra, rb;
    CHECK_OK(deft_plan_memory(a, &full.loss, 1, NULL, &ra));
    CHECK_OK(deft_plan_memory(b, &shapes.loss, 1, NULL, &rb));
    CHECK_MSG(ra.arena_bytes == rb.arena_bytes && ra.persistent_bytes == rb.persistent_bytes,
              "plans differ: arena %zu / %zu, persistent %zu / %zu", ra.arena_bytes, rb.arena_bytes,
              ra.persistent_bytes, rb.persistent_bytes);
    /* The token table: N(0, 0.02) drawn in the full build, its creation value (zeros) in the other. */
    float wa[64 * 32], wb[64 * 32];
    CHECK_OK(deft_param_get(full.wte, wa, sizeof wa));
    CHECK_OK(deft_param_get(shapes.wte, wb, sizeof wb));
    int drawn = 0, zero = 1;
    for (int i = 0; i < 64 * 32; i++) drawn += wa[i] != 0.0f, zero &= wb[i] == 0.0f;
    CHECK_MSG(drawn > 64 * 32 - 8 && zero, "wte: %d of %d drawn in the full build; shapes only all zero: %d", drawn,
              64 * 32, zero);
    deft_graph_free(a);
    deft_graph_free(b);
    return deft_check_finish();
}
