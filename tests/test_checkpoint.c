/* Activation checkpointing on the CPU:
 *  1. random layered nets (widths, depths, activations, with and without dropout, with and without an SGD step):
 *     for budgets from the smallest that can be met up to no checkpointing, three runs give losses, gradients and
 *     steps bit-identical to the program without checkpointing, and the plan (arena + persistent) stays within the
 *     budget; below the smallest budget compiling fails with DEFT_ERR_OOM and names it;
 *  2. a marked span drops exactly the values inside it; the segment policy drops and stays exact;
 *  3. the user's graph is untouched for other compiles, the copies leave with the program, and the plan table and the
 *     DOT dump name what was dropped and recomputed;
 *  4. bad options and spans are errors with messages. */
#include "ckpt_net.h"
#include "read_file.h"

/* Without the cheap recomputations every policy adds (tests/test_checkpoint_cheap.c covers them): here a policy's
 * drops are its own. */
static deft_program *ck_compile(ck_net *n, int policy, size_t budget, int segments) {
    deft_compile_options o = {.memory_budget = budget, .checkpoint = policy, .checkpoint_segments = segments,
                              .no_cheap_recompute = 1};
    return deft_compile(n->g, n->outs, n->n_outs, &o);
}

/* The reference: the same net without checkpointing. */
static size_t ck_reference(const ck_spec *s, int runs, unsigned char **ref) {
    ck_net n;
    if (!ck_build(&n, s, deft_cpu())) return 0;
    deft_program *p = ck_compile(&n, DEFT_CHECKPOINT_NONE, 0, 0);
    CHECK_MSG(p != NULL, "plain compile: %s", deft_errmsg());
    size_t bytes = p ? ck_run(&n, p, runs, ref) : 0;
    ck_free(&n);
    return bytes;
}

static void ck_check_same(const ck_spec *s, deft_program *p, ck_net *n, const unsigned char *ref, size_t ref_bytes,
                          const char *what) {
    unsigned char *got;
    size_t bytes = ck_run(n, p, 3, &got);
    CHECK_MSG(bytes == ref_bytes && memcmp(got, ref, bytes) == 0, "net %llu (%s): values differ from the run "
              "without checkpointing", (unsigned long long)s->seed, what);
    free(got);
}

/* ---------------------------------------------------------------- 1. budgets over random nets */
static void test_budgets(uint64_t seed, int with_dropout) {
    ck_spec s;
    ck_spec_random(&s, seed, with_dropout);
    unsigned char *ref;
    size_t ref_bytes = ck_reference(&s, 3, &ref);
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    size_t smallest = ck_smallest_budget(&n);
    deft_program *plain = ck_compile(&n, DEFT_CHECKPOINT_NONE, 0, 0);
    deft_checkpoint_report base;
    CHECK_OK(deft_program_checkpoint(plain, &base));
    deft_program_free(plain);
    CHECK_MSG(smallest > 0 && smallest <= base.peak_bytes, "net %llu: smallest %zu, without %zu",
              (unsigned long long)seed, smallest, base.peak_bytes);
    for (int k = 0; k <= 4; k++) {
        /* A fresh net each time: an SGD step changes the parameters. */
        ck_net m;
        if (!ck_build(&m, &s, deft_cpu())) continue;
        size_t budget = smallest + (base.peak_bytes - smallest) * (size_t)k / 4;
        deft_program *p = ck_compile(&m, DEFT_CHECKPOINT_BUDGET, budget, 0);
        CHECK_MSG(p != NULL, "net %llu budget %zu: %s", (unsigned long long)seed, budget, deft_errmsg());
        if (!p) {
            ck_free(&m);
            continue;
        }
        deft_checkpoint_report r;
        CHECK_OK(deft_program_checkpoint(p, &r));
        CHECK_MSG(r.peak_bytes <= budget, "net %llu: peak %zu over the budget %zu", (unsigned long long)seed,
                  r.peak_bytes, budget);
        CHECK(r.peak_bytes_without == base.peak_bytes);
        CHECK(r.policy == DEFT_CHECKPOINT_BUDGET);
        if (budget < base.peak_bytes) CHECK_MSG(r.dropped > 0, "net %llu budget %zu: nothing dropped", (unsigned long long)seed, budget);
        if (k == 4) CHECK(r.dropped == 0 && r.recomputed == 0 && r.recompute_flops == 0.0);
        if (r.dropped > 0) CHECK(r.recomputed >= r.dropped && r.recompute_flops > 0 && r.dropped_bytes > 0);
        ck_check_same(&s, p, &m, ref, ref_bytes, "budget");
        ck_free(&m);
    }
    if (smallest > 1) {
        deft_program *p = ck_compile(&n, DEFT_CHECKPOINT_BUDGET, smallest - 1, 0);
        CHECK(p == NULL);
        char want[96];
        snprintf(want, sizeof want, "the smallest budget this program fits is %zu bytes", smallest);
        CHECK_MSG(deft_errmsg() && strstr(deft_errmsg(), want), "message \"%s\" lacks \"%s\"", deft_errmsg(), want);
        CHECK(strstr(deft_errmsg(), "cannot be met") != NULL);
    }
    ck_free(&n);
    free(ref);
}

/* ---------------------------------------------------------------- 2. marks and segments */
static ck_spec ck_mlp(int depth, int width, double dropout) {
    ck_spec s;
    memset(&s, 0, sizeof s);
    s.seed = 4242;
    s.depth = depth;
    s.batch = 64;   /* activations larger than the gradients, so that dropping them lowers the peak */
    s.in = 7;
    for (int l = 0; l < depth; l++) {
        s.width[l] = width;
        s.act[l] = l % 2;
        s.dropout[l] = dropout;
    }
    return s;
}

static void test_marked_span(void) {
    ck_spec s = ck_mlp(5, 16, 0.2);
    unsigned char *ref;
    size_t ref_bytes = ck_reference(&s, 3, &ref);
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    /* checkpoint(layers 1..3): keep l0.act and l3.act; inside, the backward pass reads l1.pre and l3.pre (tanh's
     * gradient reads its input), layer 2's relu output (relu's reads its output), and l1.act and l2.act (the next
     * matmul's weight gradient reads them): five values. */
    CHECK_OK(deft_checkpoint_span(n.act[0], n.act[3]));
    deft_program *p = ck_compile(&n, DEFT_CHECKPOINT_MARKED, 0, 0);
    CHECK_MSG(p != NULL, "marked: %s", deft_errmsg());
    if (p) {
        deft_checkpoint_report r;
        CHECK_OK(deft_program_checkpoint(p, &r));
        CHECK(r.policy == DEFT_CHECKPOINT_MARKED);
        CHECK_MSG(r.dropped == 5 && r.dropped_bytes == 5 * 64 * 16 * sizeof(float), "dropped %d (%zu bytes)",
                  r.dropped, r.dropped_bytes);
        CHECK(r.peak_bytes < r.peak_bytes_without);
        char *text = ck_plan_text(p);
        if (!text) text = calloc(1, 1);
        CHECK(strstr(text, "checkpointing (marked spans)") != NULL);
        CHECK(strstr(text, "dropped    l1.pre") && strstr(text, "dropped    l1.act") && strstr(text, "dropped    l2.act") &&
              strstr(text, "dropped    l3.pre"));
        CHECK(strstr(text, "dropped    l0.act") == NULL && strstr(text, "dropped    l3.act") == NULL);
        CHECK(strstr(text, "dropped    l4.") == NULL);
        CHECK(strstr(text, "recompute  l1.pre") != NULL);
        free(text);
        ck_check_same(&s, p, &n, ref, ref_bytes, "marked");
        deft_program_free(p);
    }
    ck_free(&n);
    free(ref);
}

static void test_segments(void) {
    ck_spec s = ck_mlp(16, 12, 0.1);
    unsigned char *ref;
    size_t ref_bytes = ck_reference(&s, 3, &ref);
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    for (int segments = 0; segments <= 8; segments += 2) {
        deft_program *p = ck_compile(&n, DEFT_CHECKPOINT_SEGMENTS, 0, segments);
        CHECK_MSG(p != NULL, "segments %d: %s", segments, deft_errmsg());
        if (!p) continue;
        deft_checkpoint_report r;
        CHECK_OK(deft_program_checkpoint(p, &r));
        CHECK_MSG(r.dropped > 0 && r.peak_bytes < r.peak_bytes_without, "segments %d: dropped %d, peak %zu of %zu",
                  segments, r.dropped, r.peak_bytes, r.peak_bytes_without);
        ck_check_same(&s, p, &n, ref, ref_bytes, "segments");
        deft_program_free(p);
    }
    /* 16 layers of two saved values each, 4 segments: the boundaries are the 8th, 16th and 24th values (l3.act,
     * l7.act, l11.act); everything before l11.act but them is dropped (21 values), layers 12 to 15 are kept whole. */
    deft_program *four = ck_compile(&n, DEFT_CHECKPOINT_SEGMENTS, 0, 4);
    char *text = four ? ck_plan_text(four) : NULL;
    CHECK(text && strstr(text, "checkpointing (segments): 21 activations dropped"));
    CHECK(text && strstr(text, "dropped    l0.act") && strstr(text, "dropped    l11.pre"));
    CHECK(text && !strstr(text, "dropped    l3.act") && !strstr(text, "dropped    l7.act") &&
          !strstr(text, "dropped    l11.act") && !strstr(text, "dropped    l12.") && !strstr(text, "dropped    l15."));
    free(text);
    deft_program_free(four);
    /* One segment is the whole net, the last one, which checkpoint_sequential does not checkpoint. */
    deft_program *one = ck_compile(&n, DEFT_CHECKPOINT_SEGMENTS, 0, 1);
    deft_checkpoint_report r;
    CHECK_OK(deft_program_checkpoint(one, &r));
    CHECK(r.dropped == 0);
    deft_program_free(one);
    ck_free(&n);
    free(ref);
}

/* ---------------------------------------------------------------- 3. the graph stays the user's */
static void test_graph_untouched(void) {
    ck_spec s = ck_mlp(6, 10, 0.0);
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    int nodes = deft_graph_node_count(n.g);
    deft_program *plain = ck_compile(&n, DEFT_CHECKPOINT_NONE, 0, 0);
    int plain_steps = deft_program_step_count(plain);
    unsigned char *before;
    size_t bytes = ck_run(&n, plain, 1, &before);
    deft_program *p = ck_compile(&n, DEFT_CHECKPOINT_SEGMENTS, 0, 3);
    CHECK(p != NULL);
    CHECK(deft_graph_node_count(n.g) > nodes);
    /* The earlier program runs as before; one compiled now schedules what a plain compile did. */
    unsigned char *again;
    CHECK(ck_run(&n, plain, 1, &again) == bytes);
    deft_program *later = ck_compile(&n, DEFT_CHECKPOINT_NONE, 0, 0);
    CHECK(deft_program_step_count(later) == plain_steps);
    /* Outputs of the checkpointed program are read through the user's tensors, and the user's backward nodes are
     * not what runs. */
    CHECK(deft_program_schedules(p, n.loss));
    CHECK(!deft_program_schedules(p, n.outs[1]));
    CHECK_OK(deft_graph_dump_dot(n.g, p, "test_checkpoint.dot"));
    char *dot = read_file("test_checkpoint.dot");
    CHECK(dot && strstr(dot, "recomputed for the backward pass") && strstr(dot, "dropped after the forward pass"));
    CHECK(dot && strstr(dot, "#c1121f"));
    free(dot);
    CHECK_OK(deft_graph_dump_dot(n.g, later, "test_checkpoint_plain.dot"));
    dot = read_file("test_checkpoint_plain.dot");
    CHECK(dot && !strstr(dot, "(recompute)") && !strstr(dot, "recomputed for"));
    free(dot);
    deft_program_free(later);
    deft_program_free(p);
    CHECK(deft_graph_node_count(n.g) == nodes);   /* the copies were the last nodes: they left with the program */
    deft_program_free(plain);
    free(before);
    free(again);
    ck_free(&n);
}

/* ---------------------------------------------------------------- 4. errors */
static void test_errors(void) {
    ck_spec s = ck_mlp(3, 8, 0.0);
    ck_net n;
    if (!ck_build(&n, &s, deft_cpu())) return;
    CHECK(ck_compile(&n, DEFT_CHECKPOINT_BUDGET, 0, 0) == NULL);
    CHECK(strstr(deft_errmsg(), "needs a memory_budget") != NULL);
    CHECK(ck_compile(&n, DEFT_CHECKPOINT_SEGMENTS, 0, -2) == NULL);
    CHECK(strstr(deft_errmsg(), "checkpoint_segments is -2") != NULL);
    CHECK(ck_compile(&n, 99, 0, 0) == NULL);
    CHECK(strstr(deft_errmsg(), "unknown checkpoint policy 99") != NULL);
    CHECK_ERR(deft_checkpoint_span(NULL, n.loss), DEFT_ERR_INVALID, "from or to is NULL");
    CHECK_ERR(deft_checkpoint_span(n.act[2], n.act[0]), DEFT_ERR_INVALID, "does not depend on");
    CHECK_ERR(deft_checkpoint_span(n.y, n.act[2]), DEFT_ERR_INVALID, "l2.act does not depend on y");
    ck_net other;
    if (ck_build(&other, &s, deft_cpu())) {
        CHECK_ERR(deft_checkpoint_span(n.x, other.loss), DEFT_ERR_INVALID, "different graphs");
        ck_free(&other);
    }
    /* A budget below the persistent state: the smallest is at least that. */
    CHECK(ck_compile(&n, DEFT_CHECKPOINT_BUDGET, 64, 0) == NULL);
    CHECK(strstr(deft_errmsg(), "cannot be met") != NULL);
    CHECK(deft_graph_node_count(n.g) == deft_graph_node_count(n.g));
    /* A graph without a backward pass has nothing to drop: the budget is met or not as before. */
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 1, (int64_t[]){64}, deft_cpu());
    deft_tensor *y = deft_exp(deft_relu(x));
    deft_program *p = deft_compile(g, &y, 1, &(deft_compile_options){.memory_budget = 300, .checkpoint = DEFT_CHECKPOINT_BUDGET});
    CHECK(p == NULL);
    CHECK(strstr(deft_errmsg(), "the smallest budget this program fits is") != NULL);
    deft_graph_free(g);
    ck_free(&n);
}

int main(void) {
    for (uint64_t seed = 1; seed <= 12; seed++) test_budgets(seed, 0);
    for (uint64_t seed = 101; seed <= 112; seed++) test_budgets(seed, 1);
    test_marked_span();
    test_segments();
    test_graph_untouched();
    test_errors();
    return deft_check_finish();
}
