/* Training state on cuda:0 (deft_train_state_save / _load), as llm.c resumes on a GPU:
 *  1. a net trained k steps on the GPU and saved, then trained on to n, and a second net built the same way that ran
 *     steps of its own first (its CUDA Graph captured and replaying), then loaded the file and trained from k to n,
 *     give the same losses, optimizer counters and final parameters, bit for bit: f32 SGD and AdamW, bf16 autocast,
 *     f16 autocast with its dynamic loss scale (a skipped step before the save; the scale, growth counter and
 *     skipped count follow the uninterrupted run step by step), gradient accumulation saved inside a window (f32 and
 *     bf16), layer norm, and dropout (run eagerly; its masks come from the restored run counter). Where the program
 *     replays a CUDA Graph, it replayed before the save and goes on replaying after the load;
 *  2. a shuffling loader feeding the GPU asynchronously resumes with the same batches;
 *  3. a file saved on the GPU loads into the same net on the CPU (the parameters and counters are the GPU's);
 *  4. a truncated or corrupt file leaves the GPU's parameters and state as they were: the net trains on as an
 *     untouched twin, replaying.
 * Skips (77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU standing in for cuda:0. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <stdint.h>
#include <unistd.h>

#include "train_state_net.h"

#define MAX_STEPS 32

static deft_device dev;
static char path_main[256], path_bad[256];

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Whether the program can replay a CUDA Graph (dropout, or the CPU standing in, cannot). */
static int replays(const ts_net *n) { return dev.type == DEFT_CUDA && !(n->c.ln_dropout && n->c.dropout >= 0.0); }

typedef struct opt_view {
    double lr, scale;
    int64_t updates, skipped;
} opt_view;

static opt_view view_of(const ts_net *n) {
    opt_view v = {deft_optimizer_lr(n->opt), 0, deft_optimizer_updates(n->opt), 0};
    CHECK_OK(deft_optimizer_loss_scale(n->opt, &v.scale, &v.skipped));
    return v;
}

static int same_view(opt_view a, opt_view b) {
    return a.lr == b.lr && a.scale == b.scale && a.updates == b.updates && a.skipped == b.skipped;
}

/* ---- 1. resuming ---- */

static float gain_of(int step, int overflow) { return step == overflow ? 1e30f : 1.0f; }

static void resume_case(const char *label, const ts_config *c, int k, int n, int overflow) {
    static unsigned char at_save[TS_MAX_PARAM_BYTES], final_a[TS_MAX_PARAM_BYTES], got[TS_MAX_PARAM_BYTES];
    float la[MAX_STEPS];
    opt_view va[MAX_STEPS];
    ts_net a, b;
    if (!ts_build(&a, c) || !ts_build(&b, c)) return;
    ts_set_scale(&a);
    for (int s = 0; s < n; s++) {
        if (s == 2) CHECK_OK(deft_optimizer_set_lr(a.opt, deft_optimizer_lr(a.opt) * 0.5));
        if (s == k) {
            CHECK_MSG(!replays(&a) || deft_program_graph_replays(a.p) > 0, "%s: no replay before the save: %s", label,
                      deft_program_graph_status(a.p));
            CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, NULL));
            ts_params(&a, at_save);
        }
        la[s] = ts_step(&a, (uint64_t)s, gain_of(s, overflow));
        va[s] = view_of(&a);
    }
    const size_t bytes = ts_params(&a, final_a);
    for (int s = 0; s < 4; s++) ts_step(&b, 500 + (uint64_t)s, 1.0f);   /* b captures its graph and replays */
    const int64_t replayed = deft_program_graph_replays(b.p);
    CHECK_MSG(!replays(&b) || replayed > 0, "%s: no replay before the load: %s", label, deft_program_graph_status(b.p));
    deft_status st = deft_train_state_load(path_main, b.p, b.opt, NULL);
    CHECK_MSG(st == DEFT_OK, "%s: load: %s", label, deft_errmsg());
    ts_params(&b, got);
    CHECK_MSG(memcmp(got, at_save, bytes) == 0, "%s: the loaded parameters are not the saved ones", label);
    CHECK_MSG(same_view(view_of(&b), va[k - 1]), "%s: the loaded optimizer is not the saved one", label);
    for (int s = k; s < n; s++) {
        const float lb = ts_step(&b, (uint64_t)s, gain_of(s, overflow));
        CHECK_MSG(same_bits(la[s], lb), "%s: step %d: loss %.9g resumed, %.9g uninterrupted", label, s, lb, la[s]);
        CHECK_MSG(same_view(view_of(&b), va[s]), "%s: step %d: the optimizer's counters differ", label, s);
    }
    CHECK_MSG(!replays(&b) || deft_program_graph_replays(b.p) >= replayed + (n - k) - 1,
              "%s: the loaded program stopped replaying: %s", label, deft_program_graph_status(b.p));
    ts_params(&b, got);
    CHECK_MSG(memcmp(got, final_a, bytes) == 0, "%s: the final parameters differ", label);
    ts_free(&a);
    ts_free(&b);
}

static void test_resume(void) {
    resume_case("f32 sgd", &(ts_config){.dev = dev}, 5, 10, -1);
    resume_case("f32 adamw", &(ts_config){.dev = dev, .adamw = 1}, 5, 10, -1);
    resume_case("f32 adamw, layer norm, groups",
                &(ts_config){.dev = dev, .adamw = 1, .ln_dropout = 1, .dropout = -1, .decay_groups = 1}, 6, 11, -1);
    resume_case("f32 sgd, layer norm, dropout", &(ts_config){.dev = dev, .ln_dropout = 1}, 4, 9, -1);
    resume_case("f32 adamw, accumulate 2, inside a window", &(ts_config){.dev = dev, .adamw = 1, .accumulate = 2}, 7,
                12, -1);
    ts_config bf16 = {.dev = dev, .adamw = 1, .copts = {.autocast = DEFT_BF16}};
    resume_case("bf16 adamw", &bf16, 5, 10, -1);
    bf16.accumulate = 2;
    resume_case("bf16 adamw, accumulate 2, inside a window", &bf16, 5, 10, -1);
    ts_config f16 = {.dev = dev, .adamw = 1, .copts = {.autocast = DEFT_F16}};
    f16.copts.loss_scale.growth_interval = 3;
    resume_case("f16 adamw, loss scaling", &f16, 7, 14, 1);
    f16.adamw = 0;
    f16.accumulate = 2;
    resume_case("f16 sgd, loss scaling, accumulate 2", &f16, 9, 16, 2);
}

/* ---- 2. a loader ---- */

#define DS_N 90   /* 5 batches of 16 an epoch */

static float loader_step(ts_net *n, deft_loader *l, int64_t *which) {
    deft_loader_batch bt;
    CHECK_OK(deft_loader_next(l, n->p, &bt));
    if (bt.end) CHECK_OK(deft_loader_next(l, n->p, &bt));
    *which = bt.epoch * 100 + bt.index;
    return ts_run(n);
}

static void test_loader(void) {
    static float images[DS_N * TS_IN];
    static int32_t labels[DS_N];
    uint64_t rng = 99;
    for (int i = 0; i < DS_N * TS_IN; i++) images[i] = (float)ref_unif(&rng, -1, 1);
    for (int i = 0; i < DS_N; i++) labels[i] = (int32_t)(ref_next(&rng) % TS_CLS);
    const deft_dataset d = {.n = DS_N, .features = TS_IN, .n_classes = TS_CLS, .images = images, .labels = labels};
    const ts_config c = {.dev = dev, .adamw = 1};
    const int k = 7, n = 14;
    ts_net a, b;
    deft_loader *la = NULL, *lb = NULL;
    float loss_a[MAX_STEPS];
    int64_t which_a[MAX_STEPS], which_b;
    if (!ts_build(&a, &c) || !ts_build(&b, &c)) return;
    CHECK_OK(deft_loader_new_dataset(&d, a.x, a.y, 1, 31, 2, &la));
    CHECK_OK(deft_loader_new_dataset(&d, b.x, b.y, 1, 31, 2, &lb));
    if (!la || !lb) return;
    for (int s = 0; s < n; s++) {
        if (s == k) CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, la));
        loss_a[s] = loader_step(&a, la, &which_a[s]);
    }
    for (int s = 0; s < 3; s++) loader_step(&b, lb, &which_b);   /* b's loader and program in use */
    CHECK_OK(deft_train_state_load(path_main, b.p, b.opt, lb));
    for (int s = k; s < n; s++) {
        const float l = loader_step(&b, lb, &which_b);
        CHECK_MSG(which_b == which_a[s], "loader, step %d: batch %lld resumed, %lld uninterrupted", s,
                  (long long)which_b, (long long)which_a[s]);
        CHECK_MSG(same_bits(l, loss_a[s]), "loader, step %d: loss %.9g resumed, %.9g uninterrupted", s, l, loss_a[s]);
    }
    deft_loader_free(la);
    deft_loader_free(lb);
    ts_free(&a);
    ts_free(&b);
}

/* ---- 3. from the GPU to the CPU ---- */

static void test_to_cpu(void) {
    static unsigned char on_gpu[TS_MAX_PARAM_BYTES], on_cpu[TS_MAX_PARAM_BYTES];
    ts_net g, c;
    if (!ts_build(&g, &(ts_config){.dev = dev, .adamw = 1}) || !ts_build(&c, &(ts_config){.dev = deft_cpu(), .adamw = 1}))
        return;
    for (int s = 0; s < 5; s++) ts_step(&g, (uint64_t)s, 1.0f);
    CHECK_OK(deft_train_state_save(path_main, g.p, g.opt, NULL));
    CHECK_OK(deft_train_state_load(path_main, c.p, c.opt, NULL));
    const size_t bytes = ts_params(&g, on_gpu);
    CHECK(ts_params(&c, on_cpu) == bytes && memcmp(on_gpu, on_cpu, bytes) == 0);
    CHECK(same_view(view_of(&g), view_of(&c)));
    const float lg = ts_step(&g, 5, 1.0f), lc = ts_step(&c, 5, 1.0f);
    CHECK_MSG(fabsf(lg - lc) <= 1e-4f * (1.0f + fabsf(lc)), "the next step: %.9g on the GPU, %.9g on the CPU", lg, lc);
    ts_free(&g);
    ts_free(&c);
}

/* ---- 4. refusals ---- */

static void test_refusals(void) {
    static unsigned char before[TS_MAX_PARAM_BYTES], now[TS_MAX_PARAM_BYTES];
    const ts_config c = {.dev = dev, .adamw = 1, .accumulate = 2};
    ts_net a, b, twin;
    if (!ts_build(&a, &c) || !ts_build(&b, &c) || !ts_build(&twin, &c)) return;
    for (int s = 0; s < 3; s++) ts_step(&a, (uint64_t)s, 1.0f);
    CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, NULL));
    for (int s = 0; s < 5; s++) {
        ts_step(&b, 300 + (uint64_t)s, 1.0f);
        ts_step(&twin, 300 + (uint64_t)s, 1.0f);
    }
    const size_t bytes = ts_params(&b, before);
    FILE *f = fopen(path_main, "rb");
    static unsigned char file[1 << 16];
    const size_t n = f ? fread(file, 1, sizeof file, f) : 0;
    if (f) fclose(f);
    CHECK(n > 1000 && n < sizeof file);
    const size_t cuts[] = {0, 7, 100, 140, 500, n / 2, n - 5, n - 1};
    for (int i = 0; i < (int)(sizeof cuts / sizeof cuts[0]) + 3; i++) {
        const int flip = i >= (int)(sizeof cuts / sizeof cuts[0]);
        const size_t at = flip ? n / 4 * (size_t)(i - 7) : 0, len = flip ? n : cuts[i];
        if (flip) file[at] ^= 0x01;
        FILE *w = fopen(path_bad, "wb");
        CHECK(w && fwrite(file, 1, len, w) == len);
        if (w) fclose(w);
        if (flip) file[at] ^= 0x01;
        CHECK_ERR(deft_train_state_load(path_bad, b.p, b.opt, NULL), DEFT_ERR_IO, path_bad);
        CHECK(ts_params(&b, now) == bytes && memcmp(now, before, bytes) == 0);
    }
    for (int s = 0; s < 4; s++) {
        const float lb = ts_step(&b, 400 + (uint64_t)s, 1.0f), lt = ts_step(&twin, 400 + (uint64_t)s, 1.0f);
        CHECK_MSG(same_bits(lb, lt), "step %d after the refusals: %.9g, the twin %.9g", s, lb, lt);
    }
    CHECK(!replays(&b) || deft_program_graph_replays(b.p) > 0);
    ts_free(&a);
    ts_free(&b);
    ts_free(&twin);
}

int main(void) {
    if (!deft_test_gpu(&dev)) return DEFT_CHECK_SKIP;
    snprintf(path_main, sizeof path_main, "/tmp/deft_cuda_test_train_state_%ld.bin", (long)getpid());
    snprintf(path_bad, sizeof path_bad, "/tmp/deft_cuda_test_train_state_%ld_bad.bin", (long)getpid());
    test_resume();
    test_loader();
    test_to_cpu();
    test_refusals();
    remove(path_main);
    remove(path_bad);
    return deft_check_finish();
}
