/* ZeRO-1 with the compile option param_copies, without GPUs (runtime/zero_f32.c; cuda_test_zero.c runs it on 2):
 * tests/amp_net.h's MLP under bf16 autocast with copies, plus an output that reads fc3's bias in f32 (as an autocast
 * GPT-2 reads its embedding tables and layer norms).
 * - which parameters a replica reads in f32 (deft_testing_zero_f32_plan, the library's own function): fc3's bias and
 *   nothing else, while the same net without the extra output reads none in f32; for worlds of 1 to 8 the pieces
 *   their f32 values are broadcast in tile each of them in rank order, each inside its root's slice;
 * - the refusals while the f32 values are partial (deft_testing_zero_partial, as a sharded step leaves them): reading
 *   fc3's bias works and gives the values the program's own read gives; reading another parameter, writing any, and
 *   saving the training state are DEFT_ERR_STATE naming deft_dist_gather_params, and the refused save leaves no file;
 *   the program itself (reading only the copies and fc3's bias) runs and trains; a program casting the weights
 *   itself (no param_copies) is refused at run, one reading the copies runs; once whole again, everything works;
 * - deft_dist_gather_params refuses a NULL dist. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "amp_net.h"
#include "deft_testing.h"

#define B 16
#define IN 12
#define HID 20
#define CLS 5
#define MAXP 64

/* The net with the extra output sum(fc3.bias) (*extra), compiled with bf16 autocast and copies. */
static deft_program *build(amp_net *n, deft_tensor **extra) {
    if (!amp_build_with(n, deft_cpu(), B, IN, HID, CLS, (amp_optim){1, NULL})) return NULL;
    *extra = deft_sum(deft_graph_find(n->g, "fc3.bias"), 0, NULL, 0);
    const deft_compile_options o = {.autocast = DEFT_BF16, .param_copies = 1};
    deft_program *p = deft_compile(n->g, (deft_tensor *[]){n->loss, n->step, *extra}, 3, &o);
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    return p;
}

static int param_index(const deft_optimizer *o, const char *name) {
    for (int i = 0; i < deft_testing_optimizer_param_count(o); i++)
        if (!strcmp(deft_tensor_name(deft_testing_optimizer_param(o, i)), name)) return i;
    return -1;
}

/* Parameter i's first element in the flat storage, and its count. */
static void param_range(const deft_optimizer *o, int i, int64_t *off, int64_t *count) {
    *off = 0;
    for (int k = 0; k < i; k++) *off += deft_tensor_numel(deft_testing_optimizer_param(o, k));
    *count = deft_tensor_numel(deft_testing_optimizer_param(o, i));
}

static void test_plan(const amp_net *n, const deft_program *p) {
    const int np = deft_testing_optimizer_param_count(n->opt), bias = param_index(n->opt, "fc3.bias");
    CHECK(np == 6 && bias >= 0);
    bool reads[8];
    deft_testing_zero_piece pieces[MAXP];
    for (int world = 1; world <= 8; world++)
        for (int rank = 0; rank < world; rank++) {
            deft_testing_zero z;
            CHECK(deft_testing_zero_plan(n->opt, world, rank, 0, DEFT_F32, &z, NULL, 0) >= 0);
            const int m = deft_testing_zero_f32_plan(p, n->opt, world, rank, reads, pieces, MAXP);
            CHECK_MSG(m >= 1 && m <= MAXP, "world %d: %d pieces", world, m);
            for (int i = 0; i < np; i++)
                CHECK_MSG(reads[i] == (i == bias), "world %d: %s %s in f32", world,
                          deft_tensor_name(deft_testing_optimizer_param(n->opt, i)), reads[i] ? "read" : "not read");
            int64_t off, count, at;
            param_range(n->opt, bias, &off, &count);
            at = off;
            const int64_t shard = z.hi - z.lo;
            for (int k = 0; k < m && k < MAXP; k++) {
                CHECK_MSG(pieces[k].start == at && pieces[k].count > 0, "world %d: piece %d starts at %lld, expected "
                          "%lld", world, k, (long long)pieces[k].start, (long long)at);
                CHECK_MSG(pieces[k].start >= pieces[k].root * shard &&
                          pieces[k].start + pieces[k].count <= (pieces[k].root + 1) * shard,
                          "world %d: piece %d outside rank %d's slice", world, k, pieces[k].root);
                CHECK(k == 0 || pieces[k].root == pieces[k - 1].root + 1);
                at += pieces[k].count;
            }
            CHECK_MSG(at == off + count, "world %d: the pieces end at %lld, the bias at %lld", world, (long long)at,
                      (long long)(off + count));
        }
    CHECK(deft_testing_zero_f32_plan(p, n->opt, 2, 2, reads, pieces, MAXP) == -1);
    CHECK_MSG(strstr(deft_errmsg(), "rank 2 of a world of 2") != NULL, "%s", deft_errmsg());
}

/* Without the extra output the net reads every parameter through its copies. */
static void test_plan_copies_only(void) {
    amp_net n;
    if (!amp_build_with(&n, deft_cpu(), B, IN, HID, CLS, (amp_optim){1, NULL})) return;
    deft_program *p = amp_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1});
    CHECK(p != NULL);
    bool reads[8];
    deft_testing_zero_piece pieces[MAXP];
    if (p) {
        CHECK(deft_testing_zero_f32_plan(p, n.opt, 4, 1, reads, pieces, MAXP) == 0);
        for (int i = 0; i < 6; i++) CHECK_MSG(!reads[i], "parameter %d read in f32", i);
    }
    amp_free(&n);
}

static void test_partial(amp_net *n, deft_program *p, deft_tensor *extra) {
    const int bias = param_index(n->opt, "fc3.bias");
    bool flags[8] = {0};
    flags[bias] = true;
    for (int k = 0; k < 2; k++) CHECK(isfinite(amp_step(n, p, (uint64_t)k, 1.0f)));
    CHECK_OK(deft_testing_zero_partial(n->opt, flags));
    float b[CLS], sum = 0, want = 0, w[HID * HID];
    CHECK_OK(deft_param_get(deft_graph_find(n->g, "fc3.bias"), b, sizeof b));
    CHECK_ERR(deft_param_get(n->w2, w, sizeof w), DEFT_ERR_STATE, "deft_dist_gather_params");
    CHECK_ERR(deft_param_set(deft_graph_find(n->g, "fc3.bias"), b, sizeof b), DEFT_ERR_STATE,
              "deft_dist_gather_params");
    char path[96];
    snprintf(path, sizeof path, "/tmp/deft_test_zero_copies_%ld.state", (long)getpid());
    remove(path);
    CHECK_ERR(deft_train_state_save(path, p, n->opt, NULL), DEFT_ERR_STATE, "deft_dist_gather_params");
    CHECK_MSG(access(path, F_OK) != 0, "a refused save left %s", path);
    /* The program reads the copies and fc3's bias only: it runs, and its sum is the bias's (read before the run
     * updates it). */
    CHECK_OK(deft_param_get(deft_graph_find(n->g, "fc3.bias"), b, sizeof b));
    for (int c = 0; c < CLS; c++) want += b[c];
    const float loss = amp_step(n, p, 2, 1.0f);
    CHECK(isfinite(loss));
    CHECK_OK(deft_program_read(p, extra, &sum, sizeof sum));
    CHECK_MSG(fabsf(sum - want) <= 1e-6f * (1 + fabsf(want)), "sum(fc3.bias) %.9g, the bias sums to %.9g", sum, want);
    deft_program *cast = NULL, *copies = NULL;
    CHECK_OK(deft_compile_into(n->g, &n->logits, 1, &(deft_compile_options){.autocast = DEFT_BF16}, &cast));
    CHECK_OK(deft_compile_into(n->g, &n->logits, 1, &(deft_compile_options){.autocast = DEFT_BF16, .param_copies = 1},
                               &copies));
    if (cast && copies) {
        CHECK_OK(deft_program_feed(cast, n->x, n->hx, sizeof(float) * (size_t)(B * IN)));
        CHECK_OK(deft_program_feed(copies, n->x, n->hx, sizeof(float) * (size_t)(B * IN)));
        CHECK_ERR(deft_program_run(cast), DEFT_ERR_STATE, "deft_dist_gather_params");
        CHECK_OK(deft_program_run(copies));
        CHECK_OK(deft_testing_zero_partial(n->opt, NULL));   /* what the gather leaves */
        CHECK_OK(deft_program_run(cast));
        CHECK_OK(deft_param_get(n->w2, w, sizeof w));
        CHECK_OK(deft_param_set(n->w2, w, sizeof w));
        CHECK_OK(deft_train_state_save(path, p, n->opt, NULL));
        CHECK(isfinite(amp_step(n, p, 3, 1.0f)));
    }
    deft_program_free(cast);
    deft_program_free(copies);
    remove(path);
}

int main(void) {
    amp_net n;
    deft_tensor *extra = NULL;
    deft_program *p = build(&n, &extra);
    if (p) {
        test_plan(&n, p);
        test_partial(&n, p, extra);
    }
    amp_free(&n);
    test_plan_copies_only();
    CHECK_ERR(deft_dist_gather_params(NULL, NULL, 0), DEFT_ERR_INVALID, "dist is NULL");
    return deft_check_finish();
}
