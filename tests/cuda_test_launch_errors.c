/* Failures a step meets on the GPU surface as statuses and leave the program usable:
 * - a failed kernel launch (injected through the test-only hook of ops/cuda/cuda_fault.h) is DEFT_ERR_RUNTIME with
 *   the CUDA error string and the failing node's name, eagerly and while a CUDA Graph is being captured;
 * - a cross-entropy target outside [0, C) is found by the kernel without any host wait in the step, and reported as
 *   DEFT_ERR_INVALID by the next read of an output, for eager runs and CUDA Graph replays alike. */
#include "check.h"
#include "train_net.h"

#ifdef DEFT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "deft_testing.h"

#define STEPS 4

/* "too many resources requested for launch": what a kernel too large for the GPU gets. */
#define INJECTED cudaErrorLaunchOutOfResources

static void check_launch_message(const char *when) {
    const char *m = deft_errmsg();
    printf("%s: %s\n", when, m);
    CHECK_MSG(strstr(m, cudaGetErrorString(INJECTED)) != NULL, "%s: no CUDA error string in \"%s\"", when, m);
    CHECK_MSG(strstr(m, "first_softmax") != NULL, "%s: the failing node is not named in \"%s\"", when, m);
}

/* Eager runs: the failed run returns the error; the next runs train as if it had never happened (the failure came
 * before any parameter was touched). */
static void test_failed_launch_eager(void) {
    train_net n;
    if (!net_build(&n, 32, 20, 16)) return;
    deft_program *p = net_compile(&n, &(deft_compile_options){.no_cuda_graphs = 1});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        deft_cuda_fail_next_launch(INJECTED);
        CHECK_ERR(net_try_step(&n, p, 0), DEFT_ERR_RUNTIME, "run: step 0 (first_softmax");
        check_launch_message("eager");
        float got[STEPS], want[STEPS];
        for (int i = 0; i < STEPS; i++) got[i] = net_step(&n, p, (uint64_t)i);
        net_reference_losses(&n, 0, STEPS, want);
        net_check_losses("eager, after a failed launch", got, want, STEPS);
    }
    net_free(&n);
}

/* The second run captures the step into a CUDA Graph: a launch failing there ends the capture, the run returns the
 * error (nothing of it ran), and the next run captures again and replays from then on. */
static void test_failed_launch_capture(void) {
    train_net n;
    if (!net_build(&n, 32, 20, 16)) return;
    deft_program *p = net_compile(&n, NULL);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        float got[STEPS], want[STEPS];
        got[0] = net_step(&n, p, 0);   /* eager warm-up */
        deft_cuda_fail_next_launch(INJECTED);
        CHECK_ERR(net_try_step(&n, p, 1), DEFT_ERR_RUNTIME, "CUDA Graph");
        check_launch_message("capture");
        CHECK(deft_program_graph_replays(p) == 0);
        for (int i = 1; i < STEPS; i++) got[i] = net_step(&n, p, (uint64_t)i);
        CHECK_MSG(deft_program_graph_replays(p) == STEPS - 1, "replays %lld: %s",
                  (long long)deft_program_graph_replays(p), deft_program_graph_status(p));
        CHECK(strcmp(deft_program_graph_status(p), "replaying a CUDA Graph") == 0);
        net_reference_losses(&n, 0, STEPS, want);
        net_check_losses("graphs, after a failed capture", got, want, STEPS);
    }
    net_free(&n);
}

/* ---------------------------------------------------------------- bad cross-entropy targets */
#define CE_ROWS 300
#define CE_CLASSES 10

typedef struct ce_net {
    deft_graph *g;
    deft_tensor *x, *t, *loss, *grad;
    deft_program *p;
    float logits[CE_ROWS * CE_CLASSES];
    int32_t targets[CE_ROWS];
} ce_net;

/* The loss and the gradient of a bias on the logits (both kernels check the targets); no optimizer, so a bad batch
 * leaves nothing behind but its own NaN outputs. */
static int ce_build(ce_net *c, int graphs) {
    c->g = deft_graph_new();
    c->x = deft_input(c->g, "logits", DEFT_F32, 2, (int64_t[]){CE_ROWS, CE_CLASSES}, NET_GPU);
    c->t = deft_input(c->g, "targets", DEFT_I32, 1, (int64_t[]){CE_ROWS}, NET_GPU);
    deft_tensor *b = deft_param(c->g, "b", DEFT_F32, 1, (int64_t[]){CE_CLASSES}, NET_GPU, DEFT_INIT_ZEROS);
    c->loss = deft_cross_entropy(deft_add(c->x, b), c->t);
    CHECK_OK(deft_backward(c->loss));
    c->grad = deft_grad(b);
    c->p = c->grad ? deft_compile(c->g, (deft_tensor *[]){c->loss, c->grad}, 2,
                                  &(deft_compile_options){.no_cuda_graphs = !graphs})
                   : NULL;
    CHECK_MSG(c->p != NULL, "compile: %s", deft_errmsg());
    uint64_t rng = 77;
    for (int i = 0; i < CE_ROWS * CE_CLASSES; i++) c->logits[i] = (float)ref_unif(&rng, -1, 1);
    return c->p != NULL;
}

/* Runs with targets r % C, or with two bad ones (rows 201 and 250) when `bad`: the run itself must succeed. */
static void ce_run(ce_net *c, int bad) {
    for (int r = 0; r < CE_ROWS; r++) c->targets[r] = r % CE_CLASSES;
    if (bad) c->targets[250] = 12, c->targets[201] = -3;
    CHECK_OK(deft_program_feed(c->p, c->x, c->logits, sizeof c->logits));
    CHECK_OK(deft_program_feed(c->p, c->t, c->targets, sizeof c->targets));
    CHECK_OK(deft_program_run(c->p));
}

static void ce_expect_clean(ce_net *c, const char *when) {
    float loss = NAN;
    deft_status s = deft_program_read(c->p, c->loss, &loss, sizeof loss);
    CHECK_MSG(s == DEFT_OK && isfinite(loss) && loss > 0.0f, "%s: read %s (%s), loss %g", when, deft_status_name(s),
              deft_errmsg(), loss);
}

static void ce_expect_bad(ce_net *c, const char *when) {
    float loss = 0.0f;
    CHECK_ERR(deft_program_read(c->p, c->loss, &loss, sizeof loss), DEFT_ERR_INVALID,
              "cross_entropy: target -3 of row 201 is outside [0, 10)");
    CHECK_MSG(isnan(loss), "%s: the loss of a bad batch is %g, not NaN", when, loss);
    printf("%s: %s\n", when, deft_errmsg());
    /* Reported once: the other output of the same run reads clean. */
    float g[CE_CLASSES];
    CHECK_OK(deft_program_read(c->p, c->grad, g, sizeof g));
}

static void test_bad_targets(int graphs) {
    ce_net c;
    const char *mode = graphs ? "replayed" : "eager";
    if (!ce_build(&c, graphs)) {
        deft_graph_free(c.g);
        return;
    }
    for (int i = 0; i < 2; i++) {   /* with graphs: the eager warm-up, then the capture */
        ce_run(&c, 0);
        ce_expect_clean(&c, mode);
    }
    const int64_t replays = deft_program_graph_replays(c.p);
    ce_run(&c, 1);
    ce_expect_bad(&c, mode);
    if (graphs) CHECK(deft_program_graph_replays(c.p) == replays + 1);   /* the bad batch was a replay */
    ce_run(&c, 0);
    ce_expect_clean(&c, mode);

    /* Not read after the bad run: the next read reports it, even after a clean run since. */
    ce_run(&c, 1);
    ce_run(&c, 0);
    float loss;
    CHECK_ERR(deft_program_read(c.p, c.loss, &loss, sizeof loss), DEFT_ERR_INVALID, "target -3 of row 201");
    ce_run(&c, 0);
    ce_expect_clean(&c, mode);
    deft_graph_free(c.g);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_failed_launch_eager();
    test_failed_launch_capture();
    test_bad_targets(0);
    test_bad_targets(1);
    return deft_check_finish();
}
#else
DEFT_CHECK_MAIN_WITHOUT_CUDA
#endif
