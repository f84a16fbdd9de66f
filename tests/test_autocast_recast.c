/* Autocast recasts its inputs where the backward pass reads them, on the CPU (tests/amp_recast.h explains the
 * reference; cuda_test_autocast_recast.c runs the same on cuda:0):
 *  1. bf16, and f16 with loss scaling, without a checkpoint policy: losses and weights bit-identical to keeping x's
 *     cast, and the checkpoint report counts the one recast value;
 *  2. with every checkpoint policy the cast is dropped too and the run stays bit-identical; the budget search starts
 *     from it dropped (a budget the recast plan meets drops nothing else), and tighter budgets keep it dropped;
 *  3. a second compile while the first program (and its copies) lives reuses the autocast rewrite; the plan table
 *     says what was recast; an inference program recasts nothing;
 *  4. bad budgets under autocast are errors with messages;
 *  5. the conv net (NCHW and NHWC) recasts x and its f32 widening (what its first convolution reads),
 *     bit-identically. */
#include "amp_recast.h"

static deft_checkpoint_report rc_report(amp_net *n, const deft_compile_options *o) {
    deft_checkpoint_report r = {0};
    deft_program *p = amp_compile(n, o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) CHECK_OK(deft_program_checkpoint(p, &r));
    deft_program_free(p);
    return r;
}

/* ---------------------------------------------------------------- 2. policies */
static void test_policies(void) {
    const deft_compile_options plain = {.autocast = DEFT_BF16};
    rc_trace ref;
    rc_reference(deft_cpu(), &plain, &ref);
    deft_checkpoint_report r;
    rc_check_same(deft_cpu(), &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_SEGMENTS,
                                                      .checkpoint_segments = 2},
                  &ref, "bf16, two segments", &r);
    CHECK_MSG(r.dropped >= 1 && r.recomputed >= 1, "two segments: %d dropped, %d recomputed", r.dropped, r.recomputed);
    rc_check_same(deft_cpu(), &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_MARKED},
                  &ref, "bf16, marked spans", &r);
    CHECK_MSG(r.dropped >= 1, "marked spans: %d dropped", r.dropped);

    amp_net n;
    if (!amp_build(&n, deft_cpu(), RC_B, RC_IN, RC_HID, RC_CLS)) return;
    const deft_checkpoint_report base = rc_report(&n, &plain);
    /* Keeping x's cast, the search must find by itself what the recast plan meets (checkpointing sees the forward
     * pass of the autocast rewrite). */
    deft_testing_keep_input_casts(n.g, 1);
    deft_checkpoint_report kept = rc_report(&n, &(deft_compile_options){.autocast = DEFT_BF16,
                                                                        .checkpoint = DEFT_CHECKPOINT_BUDGET,
                                                                        .memory_budget = base.peak_bytes});
    CHECK_MSG(kept.dropped >= 1 && kept.peak_bytes <= base.peak_bytes, "keeping x's cast, budget %zu: %d dropped, "
              "peak %zu", base.peak_bytes, kept.dropped, kept.peak_bytes);
    amp_free(&n);
    /* The recast plan meets its own peak: the search must start from x's cast dropped and drop nothing more. */
    rc_check_same(deft_cpu(), &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_BUDGET,
                                                      .memory_budget = base.peak_bytes},
                  &ref, "bf16, budget at the recast plan's peak", &r);
    CHECK_MSG(r.dropped == 1 && r.peak_bytes <= base.peak_bytes && r.peak_bytes_without == base.peak_bytes_without,
              "budget %zu: %d dropped, peak %zu, %zu without (no policy: %zu without)", base.peak_bytes, r.dropped,
              r.peak_bytes, r.peak_bytes_without, base.peak_bytes_without);
    int met = 0;
    for (size_t budget = base.peak_bytes - 4096; budget > base.peak_bytes / 2; budget -= 4096) {
        const deft_compile_options o = {.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_BUDGET,
                                        .memory_budget = budget};
        if (!amp_build(&n, deft_cpu(), RC_B, RC_IN, RC_HID, RC_CLS)) return;
        deft_memory_report mr;
        deft_status st = deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &mr);
        amp_free(&n);
        if (st == DEFT_ERR_OOM) {
            CHECK_MSG(strstr(deft_errmsg(), "the smallest budget this program fits is") != NULL, "budget %zu: %s",
                      budget, deft_errmsg());
            break;
        }
        CHECK_MSG(st == DEFT_OK, "budget %zu: %s", budget, deft_errmsg());
        char what[80];
        snprintf(what, sizeof what, "bf16, budget %zu", budget);
        rc_check_same(deft_cpu(), &o, &ref, what, &r);
        CHECK_MSG(r.peak_bytes <= budget && r.dropped >= 1, "%s: peak %zu, %d dropped", what, r.peak_bytes,
                  r.dropped);
        met++;
    }
    printf("bf16 budgets below the recast plan's peak (%zu bytes; %zu keeping x's cast) met: %d\n", base.peak_bytes,
           base.peak_bytes_without, met);
    CHECK(met >= 1);
}

/* ---------------------------------------------------------------- 3. sharing the rewrite, inference */
/* Optimizer twins the autocast rewrites made (not the programs' copies of them). */
static int rc_twins(const amp_net *n) {
    int twins = 0;
    for (int id = 0; id < deft_graph_node_count(n->g); id++) {
        const deft_tensor *t = deft_testing_node(n->g, id);
        twins += deft_testing_is_op(t, "optimizer") && deft_testing_autocast_mark(t) != DEFT_TESTING_AUTOCAST_NONE &&
                 deft_testing_ckpt_role(t) == DEFT_TESTING_CKPT_USER;
    }
    return twins;
}

static void test_sharing_and_inference(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), RC_B, RC_IN, RC_HID, RC_CLS)) return;
    const deft_compile_options o = {.autocast = DEFT_BF16};
    deft_program *p1 = amp_compile(&n, &o);
    const int after_first = deft_graph_node_count(n.g);
    deft_program *p2 = amp_compile(&n, &o);
    CHECK_MSG(p1 && p2, "compile: %s", deft_errmsg());
    CHECK_MSG(rc_twins(&n) == 1, "%d optimizer twins: the second compile made a new autocast rewrite", rc_twins(&n));
    if (p1 && p2) CHECK(rc_drops_input_cast(p1, &n) && rc_drops_input_cast(p2, &n));
    FILE *f = tmpfile();
    if (f && p2) {
        CHECK_OK(deft_program_print_plan(p2, f));
        char text[4096] = {0};
        rewind(f);
        CHECK(fread(text, 1, sizeof text - 1, f) > 0);
        char want[192];
        snprintf(want, sizeof want, "checkpointing (none; autocast recasts its inputs): 1 activations dropped (%d "
                 "bytes; 1 autocast casts of inputs, 0 made again by one pass), 1 nodes recomputed", RC_B * RC_IN * 2);
        CHECK_MSG(strstr(text, want) != NULL, "plan lacks \"%s\": %.600s", want, text);
    }
    if (f) fclose(f);
    deft_program_free(p2);
    CHECK(deft_graph_node_count(n.g) == after_first);   /* p2's copies left with it */
    deft_program_free(p1);
    deft_program *inf = deft_compile(n.g, &n.logits, 1, &o);
    CHECK_MSG(inf != NULL, "inference compile: %s", deft_errmsg());
    deft_checkpoint_report r;
    if (inf) CHECK_OK(deft_program_checkpoint(inf, &r));
    if (inf) CHECK_MSG(r.dropped == 0 && r.recomputed == 0 && r.peak_bytes == r.peak_bytes_without,
                       "inference: %d dropped, %d recomputed", r.dropped, r.recomputed);
    deft_program_free(inf);
    amp_free(&n);
}

/* ---------------------------------------------------------------- 4. errors */
static void test_errors(void) {
    amp_net n;
    if (!amp_build(&n, deft_cpu(), RC_B, RC_IN, RC_HID, RC_CLS)) return;
    deft_memory_report mr;
    CHECK_ERR(deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2,
                                &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_BUDGET,
                                                        .memory_budget = 1},
                                &mr),
              DEFT_ERR_OOM, "the smallest budget this program fits is");
    CHECK_ERR(deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2,
                                &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = DEFT_CHECKPOINT_BUDGET},
                                &mr),
              DEFT_ERR_INVALID, "needs a memory_budget");
    CHECK_ERR(deft_plan_memory(n.g, (deft_tensor *[]){n.loss, n.step}, 2,
                                &(deft_compile_options){.autocast = DEFT_F16, .checkpoint = DEFT_CHECKPOINT_SEGMENTS,
                                                        .checkpoint_segments = -1},
                                &mr),
              DEFT_ERR_INVALID, "checkpoint_segments is -1");
    CHECK_NULL_ERR(amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .checkpoint = 42}),
                   "unknown checkpoint policy 42");
    amp_free(&n);
}

int main(void) {
    rc_check_no_policy(deft_cpu(), DEFT_BF16);
    rc_check_no_policy(deft_cpu(), DEFT_F16);
    test_policies();
    test_sharing_and_inference();
    test_errors();
    /* The CPU runs convolutions in f32 on x's bf16 values widened again: both casts are recomputed. */
    CHECK(rc_check_conv(deft_cpu(), DEFT_NCHW) == 2);
    CHECK(rc_check_conv(deft_cpu(), DEFT_NHWC) == 2);
    return deft_check_finish();
}
