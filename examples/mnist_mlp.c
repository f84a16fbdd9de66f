/* An MLP classifier (784-256-128-10, ReLU, cross-entropy, SGD with momentum) trained on MNIST's idx files, with
 * progress on the terminal and the test accuracy after each epoch. Runs on the CPU.
 *
 *   ./mnist_mlp DIR [--epochs N] [--batch B] [--lr LR]
 *   ./mnist_mlp DIR --synthetic N    writes N generated samples (and N/5 test samples) in the idx format to DIR first,
 *                                    creating DIR (and its parents) when it does not exist
 *
 * DIR holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte
 * (uncompressed, as published with the MNIST database). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deft.h"
#include "example_util.h"

typedef struct config {
    const char *dir, *trace;
    int epochs, batch, synthetic;
    double lr;
} config;

typedef struct model {
    deft_graph *g;
    deft_tensor *x, *y, *logits, *loss, *step;
    deft_program *train, *eval;
} model;

static int parse(int argc, char **argv, config *c) {
    *c = (config){NULL, NULL, 5, 64, 0, 0.05};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--epochs") && i + 1 < argc) c->epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) c->batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc) c->lr = atof(argv[++i]);
        else if (!strcmp(argv[i], "--synthetic") && i + 1 < argc) c->synthetic = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) c->trace = argv[++i];
        else if (argv[i][0] != '-' && !c->dir) c->dir = argv[i];
        else return 0;
    }
    return c->dir && c->epochs > 0 && c->batch > 0 && c->synthetic >= 0;
}

/* mkdir -p: --synthetic writes into DIR, and the first run (the README's, the hint below) names a fresh one.
 * Returns 0, or -1 with errno set. */
static int make_dirs(const char *dir) {
    char path[1024];
    const size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) {
        errno = n ? ENAMETOOLONG : ENOENT;
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        const char c = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        *p = c;
        if (c == '\0') break;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Ten classes, each a bright 8x8 square at its own place on a noisy 28x28 canvas: learnable in an epoch or two. */
static deft_status write_synthetic(const char *dir, const char *prefix, int n, uint64_t seed) {
    uint8_t *img = malloc((size_t)n * 784), *lab = malloc((size_t)n);
    if (!img || !lab) {
        free(img);
        free(lab);
        return DEFT_ERR_OOM;
    }
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int c = (int)((seed >> 33) % 10), r0 = 2 + (c / 5) * 12, c0 = 1 + (c % 5) * 5;
        lab[i] = (uint8_t)c;
        for (int p = 0; p < 784; p++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int r = p / 28, col = p % 28, on = r >= r0 && r < r0 + 8 && col >= c0 && col < c0 + 8;
            img[(size_t)i * 784 + p] = (uint8_t)(on ? 160 + (seed >> 59) * 6 : (seed >> 58) * 2);
        }
    }
    char ip[1024], lp[1024];
    snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte", dir, prefix);
    deft_idx images = {0x08, 3, {n, 28, 28}, img, (size_t)n * 784}, labels = {0x08, 1, {n}, lab, (size_t)n};
    deft_status s = deft_idx_write(ip, &images);
    if (s == DEFT_OK) s = deft_idx_write(lp, &labels);
    free(img);
    free(lab);
    return s;
}

static deft_status load(const char *dir, const char *prefix, deft_dataset *d) {
    char ip[1024], lp[1024];
    snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte", dir, prefix);
    return deft_dataset_load_idx(ip, lp, d);
}

static deft_status build(model *m, const config *c, int64_t features) {
    m->g = deft_graph_new();
    deft_graph_set_seed(m->g, 1);
    deft_device cpu = deft_cpu();
    m->x = deft_input(m->g, "x", DEFT_F32, 2, (int64_t[]){c->batch, features}, cpu);
    m->y = deft_input(m->g, "labels", DEFT_I32, 1, (int64_t[]){c->batch}, cpu);
    deft_tensor *h = deft_relu(deft_linear(m->x, 256, "fc1", NULL));
    h = deft_relu(deft_linear(h, 128, "fc2", NULL));
    m->logits = deft_linear(h, 10, "fc3", NULL);
    m->loss = deft_cross_entropy(m->logits, m->y);
    deft_status s = deft_backward(m->loss);
    if (s != DEFT_OK) return s;
    deft_optimizer *opt = deft_sgd(m->g, &(deft_sgd_options){.lr = c->lr, .momentum = 0.9}, NULL);
    m->step = deft_optimizer_step(opt);
    m->train = deft_compile(m->g, (deft_tensor *[]){m->loss, m->step}, 2, NULL);
    m->eval = m->train ? deft_compile(m->g, &m->logits, 1, NULL) : NULL;
    return m->eval ? DEFT_OK : deft_graph_error(m->g) ? deft_graph_error(m->g) : DEFT_ERR_INVALID;
}

static deft_status train_epoch(model *m, const deft_dataset *d, int batch, int epoch, uint64_t seed) {
    int64_t *order = malloc((size_t)d->n * sizeof *order);
    float *x = malloc((size_t)batch * (size_t)d->features * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    deft_status s = order && x && y ? DEFT_OK : DEFT_ERR_OOM;
    if (s == DEFT_OK) s = deft_shuffle(order, d->n, seed);
    int64_t steps = d->n / batch;
    double start = seconds(), sum = 0;
    const int in_place = progress_in_place();
    for (int64_t b = 0; s == DEFT_OK && b < steps; b++) {
        float loss = 0;
        s = deft_dataset_batch(d, order, b * batch, batch, x, y);
        if (s == DEFT_OK) s = deft_program_feed(m->train, m->x, x, (size_t)batch * (size_t)d->features * sizeof *x);
        if (s == DEFT_OK) s = deft_program_feed(m->train, m->y, y, (size_t)batch * sizeof *y);
        if (s == DEFT_OK) s = deft_program_run(m->train);
        if (s == DEFT_OK) s = deft_program_read(m->train, m->loss, &loss, sizeof loss);
        sum += loss;
        if (s == DEFT_OK && ((b + 1) % 50 == 0 || b + 1 == steps)) {
            double rate = (double)(b + 1) * batch / (seconds() - start);
            printf("%sepoch %d  step %lld/%lld  loss %.4f  %.0f samples/s%s", in_place ? "\r" : "", epoch,
                   (long long)(b + 1), (long long)steps, sum / (double)(b + 1), rate, in_place ? "" : "\n");
            fflush(stdout);
        }
    }
    if (in_place) printf("\n");
    free(order);
    free(x);
    free(y);
    return s;
}

/* Every test sample, the last partial batch padded with copies of its first sample (whose answers are ignored). */
static deft_status evaluate(model *m, const deft_dataset *d, int batch, double *accuracy) {
    float *x = malloc((size_t)batch * (size_t)d->features * sizeof *x), *logits = malloc((size_t)batch * 10 * sizeof *logits);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    int64_t *idx = malloc((size_t)batch * sizeof *idx), correct = 0;
    deft_status s = x && logits && y && idx ? DEFT_OK : DEFT_ERR_OOM;
    for (int64_t start = 0; s == DEFT_OK && start < d->n; start += batch) {
        int64_t real = d->n - start < batch ? d->n - start : batch;
        for (int64_t i = 0; i < batch; i++) idx[i] = start + (i < real ? i : 0);
        s = deft_dataset_batch(d, idx, 0, batch, x, y);
        if (s == DEFT_OK) s = deft_program_feed(m->eval, m->x, x, (size_t)batch * (size_t)d->features * sizeof *x);
        if (s == DEFT_OK) s = deft_program_run(m->eval);
        if (s == DEFT_OK) s = deft_program_read(m->eval, m->logits, logits, (size_t)batch * 10 * sizeof *logits);
        for (int64_t i = 0; s == DEFT_OK && i < real; i++) correct += argmax10(logits + i * 10) == y[i];
    }
    *accuracy = (double)correct / (double)d->n;
    free(x);
    free(logits);
    free(y);
    free(idx);
    return s;
}

static const char help[] =
    "usage: mnist_mlp DIR [--epochs N] [--batch B] [--lr LR] [--synthetic N] [--trace FILE]\n"
    "\n"
    "An MLP classifier (784-256-128-10, ReLU, cross-entropy, SGD with momentum 0.9) trained on the CPU on MNIST's\n"
    "idx files, with progress and the test accuracy after each epoch. DIR holds train-images-idx3-ubyte,\n"
    "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (uncompressed).\n"
    "\n"
    "  DIR             the dataset's directory (required; created with --synthetic)\n"
    "  --epochs N      epochs to train (default: 5)\n"
    "  --batch B       samples per step (default: 64)\n"
    "  --lr LR         the learning rate (default: 0.05)\n"
    "  --synthetic N   first write N generated training samples and N/5 + 1 test samples in the idx format to DIR,\n"
    "                  creating it if needed (default: 0, use the files in DIR)\n"
    "  --trace FILE    after training, run one more training step (an update too) traced: a Chrome trace-event\n"
    "                  JSON file of its steps' times (open it in ui.perfetto.dev or chrome://tracing)\n"
    "  -h, --help      this help\n";

int main(int argc, char **argv) {
    config c;
    example_help(argc, argv, help);
    if (!parse(argc, argv, &c)) {
        fprintf(stderr, "usage: %s DIR [--epochs N] [--batch B] [--lr LR] [--synthetic N] [--trace FILE]\n",
                argv[0]);
        return 2;
    }
    if (c.synthetic && make_dirs(c.dir) != 0) {
        fprintf(stderr, "mnist_mlp: cannot create the directory %s for the generated dataset: %s\n", c.dir,
                strerror(errno));
        return 1;
    }
    if (c.synthetic && (write_synthetic(c.dir, "train", c.synthetic, 11) != DEFT_OK ||
                        write_synthetic(c.dir, "t10k", c.synthetic / 5 + 1, 12) != DEFT_OK)) {
        fprintf(stderr, "mnist_mlp: writing the generated dataset to %s: %s\n", c.dir, deft_errmsg());
        return 1;
    }
    deft_dataset train = {0}, test = {0};
    if (load(c.dir, "train", &train) != DEFT_OK || load(c.dir, "t10k", &test) != DEFT_OK) {
        fprintf(stderr,
                "mnist_mlp: %s\nPut MNIST's four uncompressed idx files (train-images-idx3-ubyte, "
                "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte) in %s, or run with "
                "--synthetic 6000 to train on generated data of the same format.\n",
                deft_errmsg(), c.dir);
        deft_dataset_free(&train);
        return 1;
    }
    printf("mnist_mlp: %lld training and %lld test samples of %lld features, batch %d, lr %g\n", (long long)train.n,
           (long long)test.n, (long long)train.features, c.batch, c.lr);
    model m = {0};
    deft_status s = train.n >= c.batch ? build(&m, &c, train.features) : DEFT_ERR_INVALID;
    for (int e = 1; s == DEFT_OK && e <= c.epochs; e++) {
        double acc = 0;
        s = train_epoch(&m, &train, c.batch, e, 1000 + (uint64_t)e);
        if (s == DEFT_OK) s = evaluate(&m, &test, c.batch, &acc);
        if (s == DEFT_OK) printf("epoch %d  test accuracy %.2f%%\n", e, 100.0 * acc);
    }
    if (s == DEFT_OK && c.trace) {
        s = deft_program_trace(m.train, c.trace);
        if (s == DEFT_OK)
            printf("trace of one more step written to %s (open it in ui.perfetto.dev or chrome://tracing)\n",
                   c.trace);
    }
    if (s != DEFT_OK) fprintf(stderr, "mnist_mlp: %s\n", train.n < c.batch ? "fewer samples than one batch" : deft_errmsg());
    deft_graph_free(m.g);
    deft_dataset_free(&train);
    deft_dataset_free(&test);
    deft_memory_release_all();   /* the caches back to the driver: leak checkers see nothing left */
    return s == DEFT_OK ? 0 : 1;
}
