/* Training state on the CPU (deft_train_state_save / _load / _info), as llm.c tests its state files:
 *  1. a net trained k steps and saved, then trained on to n, and a fresh net built the same way, loaded and trained
 *     from k to n, give the same losses and final parameters, bit for bit: SGD with momentum and AdamW (a learning
 *     rate changed before the save, a frozen parameter set by hand), layer norm with dropout (the run counter) and
 *     parameter groups, f16 autocast with its dynamic loss scale (a skipped step before the save: the scale, growth
 *     counter and skipped count follow the uninterrupted run step by step), gradient accumulation saved at a window's
 *     boundary and in the middle of one; the fresh net differs before the load (the load has work to do);
 *  2. with a shuffling deft_loader over a dataset, the batches after the resume are those of the run that never
 *     stopped (mid-epoch, and right after an epoch's last batch);
 *  3. every refusal gives its status and a message naming the file, and changes nothing (the parameters compared
 *     byte for byte; the optimizer's moments, counters and the run counter by training on beside an untouched twin):
 *     the file truncated at every length, every byte flipped, a byte appended, another model or configuration, NULL
 *     arguments, an optimizer of another graph, paths that cannot be written (no file, nor temporary, left). */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir, rmdir */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "read_file.h"
#include "train_state_net.h"

#define CPU deft_cpu()

static char path_main[256], path_bad[256], path_dir[256];

static void make_paths(void) {
    const long pid = (long)getpid();
    snprintf(path_main, sizeof path_main, "/tmp/deft_test_train_state_%ld.bin", pid);
    snprintf(path_bad, sizeof path_bad, "/tmp/deft_test_train_state_%ld_bad.bin", pid);
    snprintf(path_dir, sizeof path_dir, "/tmp/deft_test_train_state_%ld_dir", pid);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- 1. resuming ---- */

static void resume_case(const char *label, const ts_config *c, int k, int n, int overflow) {
    static ts_record ra;
    static unsigned char got[TS_MAX_PARAM_BYTES];
    ts_net a, b;
    if (!ts_build(&a, c)) return;
    ts_run_saved(&a, path_main, k, n, overflow, &ra);
    if (!ts_build(&b, c)) return;
    ts_params(&b, got);
    CHECK_MSG(memcmp(got, ra.at_save, ra.bytes) != 0, "%s: a fresh net has the saved parameters already", label);
    ts_check_resumed(label, &b, path_main, k, n, overflow, &ra);
    deft_train_state_summary info;
    CHECK_OK(deft_train_state_info(path_main, &info));
    CHECK(info.runs == (uint64_t)k && info.has_optimizer && !info.has_loader);
    CHECK(info.updates == ra.view[k - 1].updates && info.lr == ra.view[k - 1].lr);
    ts_free(&a);
    ts_free(&b);
}

static void test_resume(void) {
    resume_case("sgd", &(ts_config){.dev = CPU}, 4, 9, -1);
    resume_case("adamw", &(ts_config){.dev = CPU, .adamw = 1}, 5, 10, -1);
    resume_case("adamw, layer norm, dropout, groups",
                &(ts_config){.dev = CPU, .adamw = 1, .ln_dropout = 1, .decay_groups = 1}, 6, 12, -1);
    resume_case("sgd, layer norm, dropout", &(ts_config){.dev = CPU, .ln_dropout = 1}, 3, 8, -1);
    ts_config acc = {.dev = CPU, .adamw = 1, .accumulate = 2};
    resume_case("accumulate 2, at a window's boundary", &acc, 6, 11, -1);
    resume_case("accumulate 2, inside a window", &acc, 5, 11, -1);
    ts_config sacc = {.dev = CPU, .accumulate = 3, .ln_dropout = 1};
    resume_case("sgd accumulate 3, inside a window", &sacc, 7, 13, -1);
    /* f16: step 1 overflows (skipped, the scale halves), every 3 clean steps double it; saved with 2 of 3 done. */
    ts_config f16 = {.dev = CPU, .adamw = 1, .copts = {.autocast = DEFT_F16}};
    f16.copts.loss_scale.growth_interval = 3;
    resume_case("f16 loss scaling", &f16, 7, 14, 1);
}

/* ---- 2. a loader ---- */

static void loader_case(const ts_dataset *ds, int k, int n) {
    const ts_config c = {.dev = CPU, .adamw = 1, .ln_dropout = 1};
    ts_net a, b;
    deft_loader *la = NULL, *lb = NULL;
    float loss_a[TS_MAX_STEPS];
    int64_t which_a[TS_MAX_STEPS], which_b;
    if (!ts_build(&a, &c) || !ts_build(&b, &c)) return;
    CHECK_OK(deft_loader_new_dataset(&ds->d, a.x, a.y, 1, 31, 0, &la));
    CHECK_OK(deft_loader_new_dataset(&ds->d, b.x, b.y, 1, 31, 0, &lb));
    if (!la || !lb) return;
    for (int s = 0; s < n; s++) {
        if (s == k) CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, la));
        loss_a[s] = ts_loader_step(&a, la, &which_a[s]);
    }
    deft_train_state_summary info;
    CHECK_OK(deft_train_state_info(path_main, &info));
    CHECK(info.has_loader && info.epoch * 5 + info.index == k);
    CHECK_OK(deft_train_state_load(path_main, b.p, b.opt, lb));
    for (int s = k; s < n; s++) {
        const float l = ts_loader_step(&b, lb, &which_b);
        CHECK_MSG(which_b == which_a[s], "k %d, step %d: batch %lld resumed, %lld uninterrupted", k, s,
                  (long long)which_b, (long long)which_a[s]);
        CHECK_MSG(ts_same_bits(l, loss_a[s]), "k %d, step %d: loss %.9g resumed, %.9g uninterrupted", k, s, l,
                  loss_a[s]);
    }
    CHECK(which_a[n - 1] >= 100);   /* the run crossed an epoch */
    deft_loader_free(la);
    deft_loader_free(lb);
    ts_free(&a);
    ts_free(&b);
}

static void test_loader(void) {
    static ts_dataset ds;
    ts_dataset_make(&ds);
    loader_case(&ds, 7, 13);   /* epoch 1, batch 2 */
    loader_case(&ds, 5, 9);    /* right after epoch 0's last batch, its end not yet reported */
}

/* ---- 3. refusals ---- */

/* A net with a state of its own and an untouched twin: after refusals the net must still train as the twin does. */
typedef struct guarded {
    ts_net net, twin;
    unsigned char before[TS_MAX_PARAM_BYTES];
    size_t bytes;
    ts_opt_view view;
} guarded;

static int guarded_build(guarded *g, const ts_config *c) {
    if (!ts_build(&g->net, c) || !ts_build(&g->twin, c)) return 0;
    for (int s = 0; s < 2; s++) {
        ts_step(&g->net, 100 + (uint64_t)s, 1.0f);
        ts_step(&g->twin, 100 + (uint64_t)s, 1.0f);
    }
    g->bytes = ts_params(&g->net, g->before);
    g->view = ts_view_of(&g->net);
    return 1;
}

static int guarded_unchanged(guarded *g) {
    static unsigned char now[TS_MAX_PARAM_BYTES];
    return ts_params(&g->net, now) == g->bytes && memcmp(now, g->before, g->bytes) == 0 &&
           ts_same_view(ts_view_of(&g->net), g->view);
}

/* The refusals changed nothing a run depends on: the net trains on exactly as its twin. */
static void guarded_finish(guarded *g, const char *label) {
    for (int s = 0; s < 3; s++) {
        const float a = ts_step(&g->net, 200 + (uint64_t)s, 1.0f), b = ts_step(&g->twin, 200 + (uint64_t)s, 1.0f);
        CHECK_MSG(ts_same_bits(a, b), "%s: step %d after the refusals: %.9g, the twin %.9g", label, s, a, b);
    }
    ts_free(&g->net);
    ts_free(&g->twin);
}

/* A load of `path` into g must fail with `want`, name the path and leave g as it was. */
static void refused_load(guarded *g, const char *path, deft_optimizer *opt, deft_loader *l, deft_status want,
                         const char *needle, const char *why) {
    deft_status s = deft_train_state_load(path, g->net.p, opt, l);
    CHECK_MSG(s == want, "%s: %s, wanted %s (%s)", why, deft_status_name(s), deft_status_name(want), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), path) != NULL, "%s: message \"%s\" lacks the path", why, deft_errmsg());
    CHECK_MSG(!needle || strstr(deft_errmsg(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", why,
              deft_errmsg(), needle ? needle : "");
    CHECK_MSG(guarded_unchanged(g), "%s: the refused load changed the net", why);
}

static int corrupt_message(void) {
    const char *m = deft_errmsg();
    return strstr(m, "corrupt") || strstr(m, "truncated") || strstr(m, "bad magic") || strstr(m, "version");
}

static void test_damaged_files(void) {
    const ts_config c = {.dev = CPU, .adamw = 1, .ln_dropout = 1, .accumulate = 2};
    ts_net a;
    guarded g;
    if (!ts_build(&a, &c) || !guarded_build(&g, &c)) return;
    for (int s = 0; s < 3; s++) ts_step(&a, (uint64_t)s, 1.0f);   /* inside a window: every array is saved */
    CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, NULL));
    size_t n = 0;
    unsigned char *file = read_file_bytes(path_main, &n);
    CHECK(file != NULL && n > 1000);
    if (!file) return;
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        write_file_bytes(path_bad, file, len);
        deft_status s = deft_train_state_load(path_bad, g.net.p, g.net.opt, NULL);
        if (s != DEFT_ERR_IO || !strstr(deft_errmsg(), "truncated") || !strstr(deft_errmsg(), path_bad)) {
            if (bad++ < 5) CHECK_MSG(0, "truncated to %zu of %zu bytes: %s: %s", len, n, deft_status_name(s), deft_errmsg());
        }
    }
    CHECK_MSG(guarded_unchanged(&g), "a truncated file changed the net");
    for (size_t at = 0; at < n; at++) {
        file[at] ^= 0x10;
        write_file_bytes(path_bad, file, n);
        file[at] ^= 0x10;
        deft_status s = deft_train_state_load(path_bad, g.net.p, g.net.opt, NULL);
        if (s != DEFT_ERR_IO || !corrupt_message()) {
            if (bad++ < 5) CHECK_MSG(0, "byte %zu of %zu flipped: %s: %s", at, n, deft_status_name(s), deft_errmsg());
        }
    }
    CHECK_MSG(guarded_unchanged(&g), "a corrupt file changed the net");
    file = realloc(file, n + 1);
    file[n] = 0;
    write_file_bytes(path_bad, file, n + 1);
    refused_load(&g, path_bad, g.net.opt, NULL, DEFT_ERR_IO, "trailing bytes", "a byte appended");
    write_file_bytes(path_bad, "DEFTPARM", 8);
    refused_load(&g, path_bad, g.net.opt, NULL, DEFT_ERR_IO, "bad magic", "a parameter file");
    deft_train_state_summary info;
    CHECK_ERR(deft_train_state_info(path_bad, &info), DEFT_ERR_IO, "bad magic");
    free(file);
    remove(path_bad);
    refused_load(&g, path_bad, g.net.opt, NULL, DEFT_ERR_IO, "cannot open", "no file");
    CHECK_OK(deft_train_state_load(path_main, g.net.p, g.net.opt, NULL));   /* the intact file still loads */
    ts_free(&a);
    ts_free(&g.net);
    ts_free(&g.twin);
}

/* Saves a net of config `c` (trained 3 steps) to path_bad, with or without its optimizer and a loader. */
static void save_other(const ts_config *c, int with_opt, deft_loader *l_for) {
    ts_net o;
    if (!ts_build(&o, c)) return;
    for (int s = 0; s < 3; s++) ts_step(&o, (uint64_t)s, 1.0f);
    CHECK_OK(deft_train_state_save(path_bad, o.p, with_opt ? o.opt : NULL, l_for));
    ts_free(&o);
}

static void test_other_models(void) {
    const ts_config c = {.dev = CPU, .adamw = 1, .ln_dropout = 1};
    guarded g;
    if (!guarded_build(&g, &c)) return;
    deft_optimizer *opt = g.net.opt;
    save_other(&(ts_config){.dev = CPU, .adamw = 1, .ln_dropout = 1, .hidden = 20}, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "parameter 'scale' is [20] in the file but [24]",
                 "another width");
    save_other(&(ts_config){.dev = CPU, .adamw = 1}, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "the file has no parameter 'ln.weight'", "no layer norm");
    save_other(&(ts_config){.dev = CPU, .ln_dropout = 1}, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "the optimizer is SGD in the file but AdamW here", "SGD");
    save_other(&(ts_config){.dev = CPU, .adamw = 1, .ln_dropout = 1, .accumulate = 2}, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "accumulate_steps is 2 in the file but 1", "accumulate");
    save_other(&(ts_config){.dev = CPU, .adamw = 1, .ln_dropout = 1, .decay_groups = 1}, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "weight decay", "parameter groups");
    ts_config f16 = {.dev = CPU, .adamw = 1, .ln_dropout = 1, .copts = {.autocast = DEFT_F16}};
    save_other(&f16, 1, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "loss scaling", "f16");
    save_other(&c, 0, NULL);
    refused_load(&g, path_bad, opt, NULL, DEFT_ERR_INVALID, "holds no optimizer state", "no optimizer saved");
    save_other(&c, 1, NULL);
    refused_load(&g, path_bad, NULL, NULL, DEFT_ERR_INVALID, "none was given", "no optimizer given");
    guarded_finish(&g, "other models");
}

static void test_sgd_momentum_differs(void) {
    guarded g;
    if (!guarded_build(&g, &(ts_config){.dev = CPU, .momentum = -1})) return;
    save_other(&(ts_config){.dev = CPU}, 1, NULL);
    refused_load(&g, path_bad, g.net.opt, NULL, DEFT_ERR_INVALID, "SGD's momentum buffer", "momentum");
    guarded_finish(&g, "momentum");
}

static void test_loader_refusals(void) {
    static ts_dataset ds;
    ts_dataset_make(&ds);
    deft_dataset shorter = ds.d;   /* 2 batches an epoch */
    shorter.n = 40;
    const ts_config c = {.dev = CPU, .adamw = 1};
    guarded g;
    deft_loader *l = NULL, *other = NULL;
    if (!guarded_build(&g, &c)) return;
    CHECK_OK(deft_loader_new_dataset(&ds.d, g.net.x, g.net.y, 1, 31, 0, &l));
    save_other(&c, 1, NULL);
    refused_load(&g, path_bad, g.net.opt, l, DEFT_ERR_INVALID, "holds no loader position", "no position saved");
    CHECK_OK(deft_loader_new_dataset(&shorter, g.net.x, g.net.y, 1, 31, 0, &other));
    save_other(&c, 1, other);
    refused_load(&g, path_bad, g.net.opt, l, DEFT_ERR_INVALID, "batches per epoch is 2 in the file but 5", "epochs");
    int64_t e, i;
    deft_loader_position(l, &e, &i);
    CHECK(e == 0 && i == 0);
    deft_loader_free(other);
    deft_loader_free(l);
    guarded_finish(&g, "loader");
}

static void test_bad_arguments(void) {
    const ts_config c = {.dev = CPU, .adamw = 1};
    guarded g;
    ts_net o;
    if (!guarded_build(&g, &c) || !ts_build(&o, &c)) return;
    remove(path_bad);
    CHECK_ERR(deft_train_state_save(NULL, g.net.p, g.net.opt, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_train_state_save(path_bad, NULL, g.net.opt, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_train_state_save(path_bad, g.net.p, o.opt, NULL), DEFT_ERR_INVALID, "another graph");
    CHECK(!exists(path_bad));
    CHECK_ERR(deft_train_state_load(NULL, g.net.p, g.net.opt, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_train_state_load(path_main, NULL, g.net.opt, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_train_state_info(NULL, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_OK(deft_train_state_save(path_bad, o.p, o.opt, NULL));
    refused_load(&g, path_bad, o.opt, NULL, DEFT_ERR_INVALID, "another graph", "an optimizer of another graph");
    remove(path_bad);
    char path[320], tmp[340];
    snprintf(path, sizeof path, "%s/no/such/dir/state.bin", path_dir);
    CHECK_ERR(deft_train_state_save(path, g.net.p, g.net.opt, NULL), DEFT_ERR_IO, "cannot create");
    CHECK(strstr(deft_errmsg(), path) != NULL);
    CHECK(mkdir(path_dir, 0700) == 0);   /* a directory where the file should go: the rename fails */
    CHECK_ERR(deft_train_state_save(path_dir, g.net.p, g.net.opt, NULL), DEFT_ERR_IO, "cannot rename");
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path_dir, (long)getpid());
    CHECK(!exists(tmp));
    CHECK(rmdir(path_dir) == 0);
    CHECK_MSG(guarded_unchanged(&g), "a refused save changed the net");
    ts_free(&o);
    guarded_finish(&g, "arguments");
}

/* A save replaces the file whole: a later one is what a load sees. */
static void test_replace(void) {
    ts_net a;
    if (!ts_build(&a, &(ts_config){.dev = CPU})) return;
    deft_train_state_summary info;
    CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, NULL));
    CHECK_OK(deft_train_state_info(path_main, &info));
    CHECK(info.runs == 0 && info.updates == 0 && info.lr == 0.1);
    for (int s = 0; s < 4; s++) ts_step(&a, (uint64_t)s, 1.0f);
    CHECK_OK(deft_train_state_save(path_main, a.p, a.opt, NULL));
    CHECK_OK(deft_train_state_info(path_main, &info));
    CHECK(info.runs == 4 && info.updates == 4 && info.has_optimizer == 1);
    CHECK_OK(deft_train_state_save(path_main, a.p, NULL, NULL));   /* no optimizer: its parameters and runs */
    CHECK_OK(deft_train_state_info(path_main, &info));
    CHECK(info.runs == 4 && info.has_optimizer == 0 && info.updates == 0);
    ts_free(&a);
}

int main(void) {
    make_paths();
    test_resume();
    test_loader();
    test_damaged_files();
    test_other_models();
    test_sgd_momentum_differs();
    test_loader_refusals();
    test_bad_arguments();
    test_replace();
    remove(path_main);
    remove(path_bad);
    return deft_check_finish();
}
