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

#include "read_file.h"
#include "train_state_net.h"

static deft_device dev;
static char path_main[256], path_bad[256];

/* Whether the program can replay a CUDA Graph (dropout, or the CPU standing in, cannot). */
static int replays(const ts_net *n) { return dev.type == DEFT_CUDA && !(n->c.ln_dropout && n->c.dropout >= 0.0); }

/* ---- 1. resuming ---- */

static void resume_case(const char *label, const ts_config *c, int k, int n, int overflow) {
    static ts_record ra;
    ts_net a, b;
    if (!ts_build(&a, c) || !ts_build(&b, c)) return;
    ts_run_saved(&a, path_main, k, n, overflow, &ra);
    CHECK_MSG(!replays(&a) || ra.replays_at_save > 0, "%s: no replay before the save: %s", label,
              deft_program_graph_status(a.p));
    for (int s = 0; s < 4; s++) ts_step(&b, 500 + (uint64_t)s, 1.0f);   /* b captures its graph and replays */
    const int64_t replayed = deft_program_graph_replays(b.p);
    CHECK_MSG(!replays(&b) || replayed > 0, "%s: no replay before the load: %s", label, deft_program_graph_status(b.p));
    ts_check_resumed(label, &b, path_main, k, n, overflow, &ra);
    CHECK_MSG(!replays(&b) || deft_program_graph_replays(b.p) >= replayed + (n - k) - 1,
              "%s: the loaded program stopped replaying: %s", label, deft_program_graph_status(b.p));
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

static void test_loader(void) {
    static ts_dataset ds;
    ts_dataset_make(&ds);
    const ts_config c = {.dev = dev, .adamw = 1};
    const int k = 7, n = 14;
    ts_net a, b;
    deft_loader *la = NULL, *lb = NULL;
    float loss_a[TS_MAX_STEPS];
    int64_t which_a[TS_MAX_STEPS], which_b;
    if (!ts_build(&a, &c) || !ts_build(&b, &c)) return;
    CHECK_OK(deft_loader_new_dataset(&ds.d, a.x, a.y, 1, 31, 2, &la));
    CHECK_OK(deft_loader_new_dataset(&ds.d, b.x, b.y, 1, 31, 2, &lb));
    if (!la || !lb) return;
    for (int s = 0; s < n; s++) {
        if (s == k) CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, la));
        loss_a[s] = ts_loader_step(&a, la, &which_a[s]);
    }
    for (int s = 0; s < 3; s++) ts_loader_step(&b, lb, &which_b);   /* b's loader and program in use */
    CHECK_OK(deft_train_state_load(path_main, b.p, b.opt, lb));
    for (int s = k; s < n; s++) {
        const float l = ts_loader_step(&b, lb, &which_b);
        CHECK_MSG(which_b == which_a[s], "loader, step %d: batch %lld resumed, %lld uninterrupted", s,
                  (long long)which_b, (long long)which_a[s]);
        CHECK_MSG(ts_same_bits(l, loss_a[s]), "loader, step %d: loss %.9g resumed, %.9g uninterrupted", s, l,
                  loss_a[s]);
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
    CHECK(ts_same_view(ts_view_of(&g), ts_view_of(&c)));
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
    size_t n = 0;
    unsigned char *file = read_file_bytes(path_main, &n);
    CHECK(file != NULL && n > 1000);
    if (!file) return;
    const size_t cuts[] = {0, 7, 100, 140, 500, n / 2, n - 5, n - 1};
    for (int i = 0; i < (int)(sizeof cuts / sizeof cuts[0]) + 3; i++) {
        const int flip = i >= (int)(sizeof cuts / sizeof cuts[0]);
        const size_t at = flip ? n / 4 * (size_t)(i - 7) : 0, len = flip ? n : cuts[i];
        if (flip) file[at] ^= 0x01;
        write_file_bytes(path_bad, file, len);
        if (flip) file[at] ^= 0x01;
        CHECK_ERR(deft_train_state_load(path_bad, b.p, b.opt, NULL), DEFT_ERR_IO, path_bad);
        CHECK(ts_params(&b, now) == bytes && memcmp(now, before, bytes) == 0);
    }
    for (int s = 0; s < 4; s++) {
        const float lb = ts_step(&b, 400 + (uint64_t)s, 1.0f), lt = ts_step(&twin, 400 + (uint64_t)s, 1.0f);
        CHECK_MSG(ts_same_bits(lb, lt), "step %d after the refusals: %.9g, the twin %.9g", s, lb, lt);
    }
    CHECK(!replays(&b) || deft_program_graph_replays(b.p) > 0);
    free(file);
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
