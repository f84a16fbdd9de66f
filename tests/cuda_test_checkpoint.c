/* Activation checkpointing on cuda:0 (fusion and CUDA Graph replays on): random layered nets, with and without
 * dropout and an SGD step, compiled with DEFT_CHECKPOINT_BUDGET for budgets from the smallest that can be met to
 * none, and with the segment policy; three runs give losses, gradients and step norms equal to the same net on
 * cuda:0 without checkpointing within 1e-5 relative (recomputation runs the same kernels on the same values, so they
 * are expected to be equal; the tolerance only allows for library kernels choosing another algorithm), and every
 * plan (arena + persistent) and footprint stays within its budget.
 * Skips (exit 77) where no GPU works. DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#include "ckpt_net.h"

static deft_device GPU;

static int close_f32(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabsf(a - b) <= 1e-5f * fmaxf(fabsf(b), 1e-3f);
}

static size_t ck_plain(const ck_spec *s, unsigned char **ref) {
    ck_net n;
    if (!ck_build(&n, s, GPU)) return 0;
    deft_program *p = deft_compile(n.g, n.outs, n.n_outs, NULL);
    CHECK_MSG(p != NULL, "plain compile: %s", deft_errmsg());
    size_t bytes = p ? ck_run(&n, p, 3, ref) : 0;
    ck_free(&n);
    return bytes;
}

static void ck_compare(const ck_spec *s, const deft_compile_options *o, const unsigned char *ref, size_t ref_bytes,
                       const char *what) {
    ck_net n;
    if (!ck_build(&n, s, GPU)) return;
    deft_program *p = deft_compile(n.g, n.outs, n.n_outs, o);
    CHECK_MSG(p != NULL, "net %llu %s: %s", (unsigned long long)s->seed, what, deft_errmsg());
    if (p) {
        deft_checkpoint_report r;
        CHECK_OK(deft_program_checkpoint(p, &r));
        if (o->memory_budget) CHECK_MSG(r.peak_bytes <= o->memory_budget, "net %llu %s: plan %zu over %zu",
                                        (unsigned long long)s->seed, what, r.peak_bytes, o->memory_budget);
        deft_device_footprint fp[2];
        int nfp = 0;
        CHECK_OK(deft_program_footprint(p, fp, 2, &nfp));
        CHECK(nfp == 1 && fp[0].arena_bytes + fp[0].persistent_bytes == r.peak_bytes);
        unsigned char *got;
        size_t bytes = ck_run(&n, p, 3, &got);
        CHECK(bytes == ref_bytes);
        int bad = 0;
        for (size_t i = 0; bytes == ref_bytes && i < bytes / sizeof(float); i++) {
            float a, b;
            memcpy(&a, got + i * sizeof a, sizeof a);
            memcpy(&b, ref + i * sizeof b, sizeof b);
            if (!close_f32(a, b) && bad++ < 3)
                fprintf(stderr, "net %llu %s: value %zu is %.9g, %.9g without checkpointing\n",
                        (unsigned long long)s->seed, what, i, (double)a, (double)b);
        }
        CHECK_MSG(bad == 0, "net %llu %s: %d values differ", (unsigned long long)s->seed, what, bad);
        free(got);
    }
    ck_free(&n);
}

static void test_net(uint64_t seed, int with_dropout) {
    ck_spec s;
    ck_spec_random(&s, seed, with_dropout);
    s.batch *= 8;   /* activations well above the gradients, as on a GPU */
    unsigned char *ref = NULL;
    size_t ref_bytes = ck_plain(&s, &ref);
    ck_net n;
    if (!ck_build(&n, &s, GPU)) return;
    size_t smallest = ck_smallest_budget(&n);
    /* The budgets and the smallest one are those of the search alone (ck_smallest_budget compiles without the cheap
     * recomputations every policy adds; tests/test_checkpoint_cheap.c covers them). */
    const deft_compile_options alone = {.no_cheap_recompute = 1};
    deft_memory_report plain;
    CHECK_OK(deft_plan_memory(n.g, n.outs, n.n_outs, &alone, &plain));
    ck_free(&n);
    size_t without = plain.arena_bytes + plain.persistent_bytes;
    CHECK_MSG(smallest > 0 && smallest <= without, "net %llu: smallest %zu, without %zu", (unsigned long long)seed,
              smallest, without);
    for (int k = 0; k <= 3; k++) {
        deft_compile_options o = {.memory_budget = smallest + (without - smallest) * (size_t)k / 3,
                                  .checkpoint = DEFT_CHECKPOINT_BUDGET, .no_cheap_recompute = 1};
        ck_compare(&s, &o, ref, ref_bytes, "budget");
    }
    deft_compile_options seg = {.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = 2};
    ck_compare(&s, &seg, ref, ref_bytes, "segments");
    free(ref);
}

int main(void) {
    if (!deft_test_gpu(&GPU)) return DEFT_CHECK_SKIP;
    for (uint64_t seed = 1; seed <= 6; seed++) test_net(seed, 0);
    for (uint64_t seed = 201; seed <= 206; seed++) test_net(seed, 1);
    return deft_check_finish();
}
