/* Autocast (the compile option, ir/autocast.h) on the CPU:
 *  1. a bf16 run of tests/amp_net.h follows the f32 loss curve: every one of 30 steps within 0.02 + 2% of the f32
 *     loss (bf16 keeps 8 significant bits: 0.4% per rounding), and the last loss below 60% of the first;
 *  2. what the rewrite built: one cast per weight, read by the forward and the backward matmuls; matmuls and the
 *     hidden activations in bf16, the loss in f32; the user's tensors read through (the logits cast back to f32, a
 *     weight's gradient); a second compile reuses the rewrite; the planned arena well under the f32 one's;
 *  3. autocast off (no options, 0, DEFT_F32) compiles the graph as built: nothing appended, losses and weights bit
 *     for bit those of the f32 program;
 *  4. the DOT dump draws the inserted casts with the label "autocast";
 *  5. bad input: autocast f64, i32 or out of range, loss-scale options without f16, a tensor of the original backward
 *     pass as an output. */
#include <stdint.h>

#include "amp_net.h"
#include "read_file.h"

#define B 256
#define IN 32
#define HID 64
#define CLS 8
#define STEPS 30

static const deft_compile_options BF16 = {.autocast = DEFT_BF16};

static void test_follows_f32(void) {
    amp_net a, b;
    if (!amp_build(&a, deft_cpu(), B, IN, HID, CLS) || !amp_build(&b, deft_cpu(), B, IN, HID, CLS)) return;
    deft_program *pa = amp_compile(&a, NULL), *pb = amp_compile(&b, &BF16);
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    float first = NAN, last = NAN, worst = 0;
    for (int k = 0; pa && pb && k < STEPS; k++) {
        float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
        float tol = 0.02f + 0.02f * fabsf(la);
        CHECK_MSG(isfinite(lb) && fabsf(lb - la) <= tol, "step %d: bf16 loss %.6g, f32 %.6g", k, lb, la);
        if (fabsf(lb - la) > worst) worst = fabsf(lb - la);
        if (k == 0) first = lb;
        last = lb;
    }
    printf("bf16 vs f32 over %d steps: largest loss difference %.4g; loss %.4g -> %.4g\n", STEPS, worst, first, last);
    CHECK_MSG(last < 0.6f * first, "bf16 did not learn: %.4g -> %.4g", first, last);
    CHECK(deft_optimizer_updates(b.opt) == STEPS);
    amp_free(&a);
    amp_free(&b);
}

/* The node of g named `name` with its dtype, or NULL. */
static deft_tensor *find(amp_net *n, const char *name) { return deft_graph_find(n->g, name); }

static void test_rewrite(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), B, IN, HID, CLS)) return;
    const int built = deft_graph_node_count(n.g);
    deft_tensor *w1 = find(&n, "fc1.weight"), *g1 = deft_grad(w1);
    deft_tensor *outs[] = {n.loss, n.step, n.logits, g1};
    deft_program *p = deft_compile(n.g, outs, 4, &BF16);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (!p) return;
    const int rewritten = deft_graph_node_count(n.g);
    CHECK(rewritten > built);
    deft_tensor *c1 = find(&n, "fc1.weight.bf16"), *c2 = find(&n, "fc2.weight.bf16"), *cx = find(&n, "x.bf16");
    CHECK(c1 && c2 && cx);
    if (c1) CHECK(deft_tensor_dtype(c1) == DEFT_BF16 && deft_program_schedules(p, c1));
    deft_tensor *lossb = find(&n, "loss@bf16"), *logitsb = find(&n, "logits@bf16");
    CHECK(lossb && deft_tensor_dtype(lossb) == DEFT_F32);
    CHECK(logitsb && deft_tensor_dtype(logitsb) == DEFT_BF16);
    /* The user's f32 nodes are not computed: the program runs their counterparts. */
    CHECK(!deft_program_schedules(p, n.loss));

    float loss, logits[B * CLS], grad[IN * HID];
    amp_step(&n, p, 0, 1.0f);
    amp_step(&n, p, 1, 1.0f);
    CHECK_OK(deft_program_read(p, n.logits, logits, sizeof logits));
    CHECK_OK(deft_program_read(p, g1, grad, sizeof grad));
    CHECK_OK(deft_program_read(p, n.loss, &loss, sizeof loss));
    CHECK(isfinite(loss) && isfinite(logits[0]) && isfinite(grad[0]));
    /* logits are bf16 values cast back to f32: their low 16 bits are zero. */
    uint32_t bits;
    memcpy(&bits, &logits[3], sizeof bits);
    CHECK((bits & 0xffffu) == 0);
    CHECK(deft_program_node_runs(p, c1) == 2);   /* once per step */

    /* Compiling again under bf16 reuses the rewrite: once that program and its own nodes (the recast of x,
     * passes/checkpoint.h) are gone, the graph is as before. */
    deft_program *p2 = deft_compile(n.g, outs, 2, &BF16);
    CHECK_MSG(p2 != NULL, "compile again: %s", deft_errmsg());
    deft_program_free(p2);
    CHECK(deft_graph_node_count(n.g) == rewritten);

    deft_memory_report f32r, bf16r;
    CHECK_OK(deft_plan_memory(n.g, outs, 2, NULL, &f32r));
    CHECK_OK(deft_plan_memory(n.g, outs, 2, &BF16, &bf16r));
    printf("planned arena: f32 %zu bytes, bf16 %zu bytes (%.2fx)\n", f32r.arena_bytes, bf16r.arena_bytes,
           (double)bf16r.arena_bytes / (double)f32r.arena_bytes);
    CHECK(bf16r.arena_bytes < 0.65 * (double)f32r.arena_bytes);
    CHECK(deft_graph_node_count(n.g) == rewritten);
    /* Another policy adds its own rewrite, of the user's nodes only; both are reused after it. */
    deft_memory_report f16r;
    CHECK_OK(deft_plan_memory(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_F16}, &f16r));
    const int both = deft_graph_node_count(n.g);
    CHECK(both > rewritten && both - rewritten <= rewritten - built + 2);
    CHECK_OK(deft_plan_memory(n.g, outs, 2, &BF16, &bf16r));
    CHECK_OK(deft_plan_memory(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_F16}, &f16r));
    CHECK(deft_graph_node_count(n.g) == both);
    CHECK(find(&n, "logits@bf16@f16") == NULL);
    amp_free(&n);
}

/* The id of the DOT node whose label starts with `label`, or -1. */
static int dot_node(const char *dot, const char *label) {
    char want[128];
    snprintf(want, sizeof want, "label=\"%s\\n", label);
    const char *at = strstr(dot, want);
    if (!at) return -1;
    while (at > dot && at[-1] != '\n') at--;
    int id = -1;
    return sscanf(at, "  n%d", &id) == 1 ? id : -1;
}

/* Edges leaving DOT node `id`. */
static int dot_out_edges(const char *dot, int id) {
    char want[32];
    snprintf(want, sizeof want, "  n%d -> ", id);
    int n = 0;
    for (const char *at = strstr(dot, want); at; at = strstr(at + 1, want)) n++;
    return n;
}

static void test_dot_and_sharing(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), 16, 8, 12, 4)) return;
    deft_program *p = amp_compile(&n, &BF16);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    CHECK_OK(deft_graph_dump_dot(n.g, p, "test_autocast.dot"));
    char *dot = read_file("test_autocast.dot");
    CHECK(dot != NULL);
    if (dot) {
        CHECK(strstr(dot, "fc2.weight.bf16\\ncast bf16 [12, 12] cpu\\nautocast\\narena @") != NULL);
        CHECK(strstr(dot, "x.bf16\\ncast bf16 [16, 8] cpu\\nautocast") != NULL);
        CHECK(strstr(dot, "shape=hexagon") != NULL);
        CHECK(strstr(dot, "loss\\ncross_entropy f32 [] cpu\\nnot computed") != NULL);
        /* One cast of fc2's weight, read by the forward matmul and by the backward one (d h1 = d z2 @ w2^T); none
         * of fc1's input gradient, which nothing needs. */
        int c2 = dot_node(dot, "fc2.weight.bf16");
        CHECK(c2 >= 0 && dot_out_edges(dot, c2) == 2);
        int c1 = dot_node(dot, "fc1.weight.bf16");
        CHECK(c1 >= 0 && dot_out_edges(dot, c1) == 1);
        CHECK(strstr(dot, "fc2.weight.bf16.bf16") == NULL);
        int casts = 0;
        for (const char *at = strstr(dot, "label=\"fc2.weight.bf16\\n"); at; at = strstr(at + 1, "label=\"fc2.weight.bf16\\n"))
            casts++;
        CHECK(casts == 1);
    }
    free(dot);
    amp_free(&n);
}

/* Autocast off compiles the graph as built: the same nodes, and the same numbers bit for bit. */
static void test_off_is_f32(void) {
    const deft_compile_options off[] = {{0}, {.autocast = DEFT_F32}};
    for (int v = 0; v < 2; v++) {
        amp_net a, b;
        if (!amp_build(&a, deft_cpu(), 64, IN, HID, CLS) || !amp_build(&b, deft_cpu(), 64, IN, HID, CLS)) return;
        const int built = deft_graph_node_count(b.g);
        deft_program *pa = amp_compile(&a, NULL), *pb = amp_compile(&b, &off[v]);
        CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
        CHECK(deft_graph_node_count(b.g) == built);
        for (int k = 0; pa && pb && k < 5; k++) {
            float la = amp_step(&a, pa, (uint64_t)k, 1.0f), lb = amp_step(&b, pb, (uint64_t)k, 1.0f);
            CHECK_MSG(memcmp(&la, &lb, sizeof la) == 0, "step %d: %.9g vs %.9g", k, la, lb);
        }
        float wa[HID * HID], wb[HID * HID];
        amp_weight(&a, wa);
        amp_weight(&b, wb);
        CHECK(memcmp(wa, wb, sizeof wa) == 0);
        amp_free(&a);
        amp_free(&b);
    }
}

static void test_bad_input(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), 16, 8, 12, 4)) return;
    deft_tensor *outs[] = {n.loss, n.step};
    const int built = deft_graph_node_count(n.g);
    CHECK_NULL_ERR(deft_compile(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_F64}),
                   "autocast must be bf16 or f16 (or 0, f32, for off), got f64");
    CHECK_NULL_ERR(deft_compile(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_I32}), "got i32");
    CHECK_NULL_ERR(deft_compile(n.g, outs, 2, &(deft_compile_options){.autocast = (deft_dtype)77}),
                   "got an unknown dtype");
    CHECK_NULL_ERR(deft_compile(n.g, outs, 2,
                                &(deft_compile_options){.autocast = DEFT_BF16, .loss_scale = {.init_scale = 8}}),
                   "loss_scale options apply to f16 autocast only (autocast is bf16)");
    CHECK_NULL_ERR(deft_compile(n.g, outs, 2, &(deft_compile_options){.loss_scale = {.disable = 1}}),
                   "loss_scale options apply to f16 autocast only (autocast is off)");
    deft_memory_report r;
    CHECK_ERR(deft_plan_memory(n.g, outs, 2, &(deft_compile_options){.autocast = DEFT_F64}, &r), DEFT_ERR_INVALID,
              "autocast must be bf16 or f16");
    CHECK(deft_graph_node_count(n.g) == built);   /* nothing was rewritten */
    /* An inner node of the original backward pass has no counterpart. */
    deft_tensor *inner = NULL;
    for (int i = 0; !inner && i < 200; i++) {
        char name[32];
        snprintf(name, sizeof name, "sum_%d", i);   /* a bias gradient before its reshape */
        inner = deft_graph_find(n.g, name);
    }
    CHECK(inner != NULL);
    if (inner)
        CHECK_NULL_ERR(deft_compile(n.g, &inner, 1, &BF16), "lies inside the backward pass as built");
    CHECK(deft_graph_error(n.g) == DEFT_OK);
    amp_free(&n);
}

int main(void) {
    test_follows_f32();
    test_rewrite();
    test_dot_and_sharing();
    test_off_is_f32();
    test_bad_input();
    return deft_check_finish();
}
