/* The main example: a small graph on the default device (the first GPU if one works, else the CPU), run once,
 * its results and memory plan printed and its graph written to hello_deft.dot. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#include "deft.h"
#include "example_util.h"

static const char help[] =
    "usage: hello_deft [--trace FILE]\n"
    "\n"
    "The main example: a small two-layer perceptron's forward pass built as a graph on the default device (the\n"
    "first GPU if one works, else the CPU), compiled, run once, its results and memory plan printed and its graph\n"
    "written to hello_deft.dot in the current directory.\n"
    "\n"
    "  --trace FILE  run the step traced: a Chrome trace-event JSON file of its steps' times (open it in\n"
    "                ui.perfetto.dev or chrome://tracing)\n"
    "  -h, --help    this help\n";

#define CHECK_OR_FAIL(cond)                                                         \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "hello_deft: %s\n", deft_errmsg());                     \
            deft_graph_free(g);                                                     \
            return 1;                                                               \
        }                                                                           \
    } while (0)

int main(int argc, char **argv) {
    example_help(argc, argv, help);
    int bad = 0;
    const char *trace = example_trace_arg(&argc, argv, &bad);
    if (bad || argc > 1) {
        fprintf(stderr, "usage: hello_deft [--trace FILE] (--help tells more)\n");
        return 2;
    }
    deft_device dev = deft_device_default();
    char dev_str[32], dev_name[256] = "";
    deft_device_name(dev, dev_name, sizeof dev_name);
    printf("deft %s on %s (%s)\n", deft_version(), deft_device_str(dev, dev_str, sizeof dev_str), dev_name);

    deft_graph *g = deft_graph_new();
    CHECK_OR_FAIL(g);
    deft_graph_set_seed(g, 42);
    /* A two-layer perceptron's forward pass: probs = softmax(relu(x @ w1 + b1) @ w2, -1). */
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){4, 3}, dev);
    deft_tensor *w1 = deft_param(g, "w1", DEFT_F32, 2, (int64_t[]){3, 8}, dev, DEFT_INIT_KAIMING);
    deft_tensor *b1 = deft_param(g, "b1", DEFT_F32, 1, (int64_t[]){8}, dev, DEFT_INIT_ZEROS);
    deft_tensor *w2 = deft_param(g, "w2", DEFT_F32, 2, (int64_t[]){8, 2}, dev, DEFT_INIT_XAVIER);
    deft_tensor *h = deft_set_name(deft_relu(deft_add(deft_matmul(x, w1), b1)), "hidden");
    deft_tensor *logits = deft_set_name(deft_matmul(h, w2), "logits");
    deft_tensor *probs = deft_set_name(deft_softmax(logits, -1), "probs");
    deft_tensor *total = deft_set_name(deft_sum(probs, 0, NULL, 0), "total");
    /* Built but never asked for: compiling leaves it out. */
    deft_tensor *unused = deft_set_name(deft_exp(logits), "unused");
    CHECK_OR_FAIL(probs && total && unused);

    deft_tensor *outs[] = {probs, total};
    deft_program *p = deft_compile(g, outs, 2, NULL);
    CHECK_OR_FAIL(p);
    float xs[12] = {1, 2, 3, -1, 0.5f, 2, 0, 0, 0, 3, -2, 1};
    CHECK_OR_FAIL(deft_program_feed(p, x, xs, sizeof xs) == DEFT_OK);
    /* A trace runs the step itself (the same step), timing each node. */
    CHECK_OR_FAIL((trace ? deft_program_trace(p, trace) : deft_program_run(p)) == DEFT_OK);
    if (trace) printf("trace of the step written to %s (open it in ui.perfetto.dev or chrome://tracing)\n", trace);
    float pr[8], tot;
    CHECK_OR_FAIL(deft_program_read(p, probs, pr, sizeof pr) == DEFT_OK);
    CHECK_OR_FAIL(deft_program_read(p, total, &tot, sizeof tot) == DEFT_OK);

    printf("probs = softmax(relu(x @ w1 + b1) @ w2):\n");
    for (int i = 0; i < 4; i++) printf("  row %d: %.6f %.6f\n", i, pr[2 * i], pr[2 * i + 1]);
    printf("sum of all probabilities: %.6f (4 rows)\n", tot);
    printf("steps run: %d (the unused branch ran %lld times)\n", deft_program_step_count(p),
           (long long)deft_program_node_runs(p, unused));

    deft_memory_report r;
    deft_program_memory(p, &r);
    printf("memory: arena %zu bytes (lower bound %zu, %zu without reuse), persistent %zu bytes, %d buffers\n",
           r.arena_bytes, r.lower_bound_bytes, r.no_reuse_bytes, r.persistent_bytes, r.buffers);
    deft_program_print_plan(p, stdout);
    CHECK_OR_FAIL(deft_graph_dump_dot(g, p, "hello_deft.dot") == DEFT_OK);
    printf("graph written to hello_deft.dot (render: dot -Tsvg hello_deft.dot -o hello_deft.svg)\n");
    deft_graph_free(g);
    deft_memory_release_all();   /* the caches back to the driver: leak checkers see nothing left */
    return 0;
}
