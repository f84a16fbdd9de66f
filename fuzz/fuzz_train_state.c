/* libFuzzer target: deft_train_state_load on any bytes, into an AdamW MLP with gradient accumulation on the CPU (a
 * parameter the optimizer does not update among its parameters). Every outcome must be a status; a refused file must
 * leave the parameters and the optimizer's counters as they were, and a loaded one must save and load back to the
 * same values. Seeds (--write-seeds DIR): the state of the model after 3 runs (inside an accumulation window: every
 * array present) and after 4, and a state without its optimizer. */
#include "fuzz_common.h"

#define B 4
#define IN 6
#define HID 8
#define CLS 3

static deft_graph *g;
static deft_program *prog;
static deft_optimizer *opt;
static deft_tensor *x, *y, *loss, *params[5];

static void build(void) {
    g = deft_graph_new();
    deft_graph_set_seed(g, 5);
    x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){B, IN}, deft_cpu());
    y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){B}, deft_cpu());
    deft_tensor *scale = deft_param(g, "scale", DEFT_F32, 1, (int64_t[]){HID}, deft_cpu(), DEFT_INIT_ONES);
    if (!scale || deft_param_set_requires_grad(scale, 0) != DEFT_OK) deft_fuzz_die("cannot build the model");
    deft_tensor *h = deft_relu(deft_mul(deft_linear(x, HID, "fc1", NULL), scale));
    loss = deft_cross_entropy(deft_linear(h, CLS, "fc2", NULL), y);
    if (deft_backward(loss) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    opt = deft_adamw(g, NULL, &(deft_step_options){.accumulate_steps = 2});
    deft_tensor *step = deft_optimizer_step(opt);
    prog = step ? deft_compile(g, (deft_tensor *[]){loss, step}, 2, NULL) : NULL;
    if (!prog) deft_fuzz_die(deft_errmsg());
    const char *names[] = {"scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    for (int i = 0; i < 5; i++)
        if (!(params[i] = deft_graph_find(g, names[i]))) deft_fuzz_die("a parameter is missing");
}

static void run(int k) {
    float hx[B * IN];
    int32_t hy[B];
    for (int i = 0; i < B * IN; i++) hx[i] = (float)((i * 7 + k * 3) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < B; i++) hy[i] = (i + k) % CLS;
    if (deft_program_feed(prog, x, hx, sizeof hx) != DEFT_OK || deft_program_feed(prog, y, hy, sizeof hy) != DEFT_OK ||
        deft_program_run(prog) != DEFT_OK)
        deft_fuzz_die(deft_errmsg());
}

/* Every parameter's bytes, then the optimizer's update count and rate. */
static size_t snapshot(unsigned char *buf, size_t cap) {
    size_t at = 0;
    for (int i = 0; i < 5; i++) {
        size_t n = deft_tensor_nbytes(params[i]);
        if (at + n > cap || deft_param_get(params[i], buf + at, n) != DEFT_OK) deft_fuzz_die("snapshot");
        at += n;
    }
    const int64_t updates = deft_optimizer_updates(opt);
    const double lr = deft_optimizer_lr(opt);
    if (at + sizeof updates + sizeof lr > cap) deft_fuzz_die("snapshot");
    memcpy(buf + at, &updates, sizeof updates);
    memcpy(buf + at + sizeof updates, &lr, sizeof lr);
    return at + sizeof updates + sizeof lr;
}

static void write_seeds(const char *dir) {
    const char *tmp = deft_fuzz_path("seed.state");
    for (int k = 0; k < 4; k++) {
        run(k);
        if (k < 2) continue;
        if (deft_train_state_save(tmp, prog, opt, NULL) != DEFT_OK) deft_fuzz_die(deft_errmsg());
        deft_fuzz_seed_file(dir, k == 2 ? "window.state" : "boundary.state", tmp);
    }
    if (deft_train_state_save(tmp, prog, NULL, NULL) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    deft_fuzz_seed_file(dir, "no_optimizer.state", tmp);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    build();
    deft_fuzz_start(argc, argv, write_seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned char before[8192], after[8192];
    const char *path = deft_fuzz_path("input.state"), *again = deft_fuzz_path("again.state");
    deft_fuzz_write(path, data, size);
    const size_t n = snapshot(before, sizeof before);
    deft_status s = deft_train_state_load(path, prog, opt, NULL);
    snapshot(after, sizeof after);
    if (!deft_fuzz_loaded(s, before, after, n)) return 0;
    /* Loaded: what it set saves and loads back bit for bit, and the program still runs. */
    FUZZ_ASSERT(deft_train_state_save(again, prog, opt, NULL) == DEFT_OK);
    FUZZ_ASSERT(deft_train_state_load(again, prog, opt, NULL) == DEFT_OK);
    snapshot(before, sizeof before);
    FUZZ_ASSERT(memcmp(before, after, n) == 0);
    run(0);
    return 0;
}
