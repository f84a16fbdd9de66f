/* ResNet-18 (torchvision's layout, 10 classes: examples/resnet18.h) trained on CIFAR-10 with SGD, momentum 0.9,
 * weight decay 5e-4 and a cosine learning rate, batches made on a loader thread with torchvision's augmentation
 * (random crop 32 with padding 4, horizontal flip), progress on the terminal and the test accuracy after each epoch
 * (batch norm in evaluation mode, on its running statistics).
 *
 *   ./resnet18_cifar [DIR] [--epochs N] [--batch B] [--lr LR] [--device cpu|cuda|cuda:N] [--nhwc] [--amp bf16]
 *                    [--steps N] [--no-augment] [--synthetic N]
 *
 * DIR (or the environment variable DEFT_CIFAR_DIR) holds CIFAR-10's binary files: data_batch_1.bin ..
 * data_batch_5.bin and test_batch.bin, as cifar-10-binary.tar.gz extracts them (cifar-10-batches-bin/).
 * --synthetic N trains on N generated images of the same shape (and N / 5 test images) instead: each class a colour
 * over noise, learnable in an epoch. --steps N stops each epoch after N steps (a quick look on the CPU). The device
 * defaults to cuda:0 when a GPU works, else the CPU. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deft.h"
#include "example_util.h"
#include "resnet18.h"

typedef struct config {
    const char *dir, *device;
    int epochs, batch, synthetic, nhwc, augment;
    int64_t steps;
    double lr;
    deft_dtype amp;
} config;

static int parse(int argc, char **argv, config *c) {
    *c = (config){.dir = getenv("DEFT_CIFAR_DIR"), .epochs = 30, .batch = 128, .augment = 1, .lr = 0.1};
    int dir_given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--epochs") && i + 1 < argc) c->epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) c->batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lr") && i + 1 < argc) c->lr = atof(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) c->device = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) c->steps = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--synthetic") && i + 1 < argc) c->synthetic = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nhwc")) c->nhwc = 1;
        else if (!strcmp(argv[i], "--no-augment")) c->augment = 0;
        else if (!strcmp(argv[i], "--amp") && i + 1 < argc && !strcmp(argv[i + 1], "bf16")) c->amp = DEFT_BF16, i++;
        else if (argv[i][0] != '-' && !dir_given) c->dir = argv[i], dir_given = 1;
        else return 0;
    }
    return c->epochs > 0 && c->batch > 0 && c->synthetic >= 0 && c->steps >= 0 && c->lr > 0;
}

/* n images whose class is their colour: each class a mean colour from a palette, plus noise per pixel. */
static deft_status make_synthetic(int n, uint64_t seed, deft_cifar *d) {
    static const uint8_t palette[10][3] = {{200, 40, 40},  {40, 200, 40}, {40, 40, 200},  {200, 200, 40},
                                           {200, 40, 200}, {40, 200, 200}, {120, 120, 120}, {230, 150, 60},
                                           {60, 100, 160}, {150, 60, 230}};
    *d = (deft_cifar){.n = n, .pixels = malloc((size_t)n * DEFT_CIFAR_IMAGE_BYTES), .labels = malloc((size_t)n * 4)};
    if (!d->pixels || !d->labels) return DEFT_ERR_OOM;
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % 10);
        d->labels[i] = k;
        for (int p = 0; p < DEFT_CIFAR_IMAGE_BYTES; p++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int v = palette[k][p / 1024] + (int)((seed >> 58) & 63) - 32;
            d->pixels[(size_t)i * DEFT_CIFAR_IMAGE_BYTES + p] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    return DEFT_OK;
}

static int load_data(const config *c, deft_cifar *train, deft_cifar *test) {
    if (c->synthetic) {
        if (make_synthetic(c->synthetic, 11, train) == DEFT_OK &&
            make_synthetic(c->synthetic / 5 + 1, 12, test) == DEFT_OK)
            return 1;
        fprintf(stderr, "resnet18_cifar: out of host memory for %d generated images\n", c->synthetic);
        return 0;
    }
    const char *dir = c->dir ? c->dir : "cifar-10-batches-bin";
    if (deft_cifar_load(dir, 1, train) == DEFT_OK && deft_cifar_load(dir, 0, test) == DEFT_OK) return 1;
    fprintf(stderr,
            "resnet18_cifar: %s\n"
            "Put CIFAR-10's binary files (data_batch_1.bin .. data_batch_5.bin and test_batch.bin: extract\n"
            "cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html,\n"
            "which makes cifar-10-batches-bin/)\n"
            "in %s%s,\nor give their directory as the first argument or in DEFT_CIFAR_DIR,\n"
            "or run with --synthetic 5000 to train on generated images of the same shape.\n",
            deft_errmsg(), dir, c->dir ? "" : " (the default, as no directory was given)");
    return 0;
}

typedef struct run {
    resnet_train t;
    deft_program *train, *eval;
    int64_t eval_batch;
} run;

static deft_status build(run *r, const config *c, deft_device dev, int64_t test_n) {
    const resnet_config rc = resnet18_config(10, c->nhwc ? DEFT_NHWC : DEFT_NCHW);
    r->eval_batch = test_n < 500 ? test_n : 500;
    const deft_sgd_options sgd = {.lr = c->lr, .momentum = 0.9, .weight_decay = 5e-4};
    deft_status s = resnet_train_build(&r->t, &rc, c->batch, r->eval_batch, 32, dev, &sgd, 1);
    const deft_compile_options co = {.autocast = c->amp};
    if (s == DEFT_OK) r->train = deft_compile(r->t.g, (deft_tensor *[]){r->t.loss, r->t.step}, 2, &co);
    if (s == DEFT_OK && r->train) r->eval = deft_compile(r->t.g, &r->t.logits_eval, 1, &co);
    if (s == DEFT_OK && !r->eval) s = DEFT_ERR_INVALID;
    return s;
}

/* One epoch through the loader, the learning rate following a cosine from lr to 0 over every step of the run. */
static deft_status train_epoch(run *r, deft_loader *l, const config *c, int epoch, int64_t per_epoch) {
    int64_t steps = c->steps && c->steps < per_epoch ? c->steps : per_epoch, total = steps * c->epochs;
    double start = seconds(), sum = 0;
    const int in_place = progress_in_place();
    deft_status s = DEFT_OK;
    for (int64_t b = 0; s == DEFT_OK && b < steps; b++) {
        deft_loader_batch lb;
        double lr = 0.5 * c->lr * (1.0 + cos(3.141592653589793 * (double)((epoch - 1) * steps + b) / (double)total));
        float loss = 0;
        s = deft_optimizer_set_lr(r->t.opt, lr);
        if (s == DEFT_OK) s = deft_loader_next(l, r->train, &lb);
        if (s == DEFT_OK) s = deft_program_run(r->train);
        if (s == DEFT_OK) s = deft_program_read(r->train, r->t.loss, &loss, sizeof loss);
        sum += loss;
        if (s == DEFT_OK && ((b + 1) % 20 == 0 || b + 1 == steps)) {
            double rate = (double)(b + 1) * c->batch / (seconds() - start);
            printf("%sepoch %d  step %lld/%lld  loss %.4f  lr %.4f  %.0f images/s%s", in_place ? "\r" : "", epoch,
                   (long long)(b + 1), (long long)steps, sum / (double)(b + 1), lr, rate, in_place ? "   " : "\n");
            fflush(stdout);
        }
    }
    if (in_place) printf("\n");
    /* A shortened epoch leaves batches in the loader: take them so the next epoch starts at its own first batch. */
    for (deft_loader_batch lb = {0}; s == DEFT_OK && !lb.end;) s = deft_loader_next(l, r->train, &lb);
    return s;
}

/* Every test image in batches of eval_batch, the last padded with copies of its first image (answers ignored). */
static deft_status evaluate(run *r, const deft_cifar *d, const config *c, double *accuracy) {
    const int64_t eb = r->eval_batch;
    const size_t x_bytes = (size_t)eb * DEFT_CIFAR_IMAGE_BYTES * sizeof(float);
    float *x = malloc(x_bytes), *logits = malloc((size_t)eb * 10 * sizeof *logits);
    int32_t *y = malloc((size_t)eb * sizeof *y);
    int64_t *idx = malloc((size_t)eb * sizeof *idx), correct = 0;
    deft_status s = x && logits && y && idx ? DEFT_OK : DEFT_ERR_OOM;
    const deft_cifar_options o = {.layout = c->nhwc ? DEFT_NHWC : DEFT_NCHW};
    for (int64_t start = 0; s == DEFT_OK && start < d->n; start += eb) {
        int64_t real = d->n - start < eb ? d->n - start : eb;
        for (int64_t i = 0; i < eb; i++) idx[i] = start + (i < real ? i : 0);
        s = deft_cifar_batch(d, idx, 0, eb, &o, 0, x, y);
        if (s == DEFT_OK) s = deft_program_feed(r->eval, r->t.x_eval, x, x_bytes);
        if (s == DEFT_OK) s = deft_program_run(r->eval);
        if (s == DEFT_OK) s = deft_program_read(r->eval, r->t.logits_eval, logits, (size_t)eb * 10 * sizeof *logits);
        for (int64_t i = 0; s == DEFT_OK && i < real; i++) correct += argmax10(logits + i * 10) == y[i];
    }
    *accuracy = (double)correct / (double)d->n;
    free(x), free(logits), free(y), free(idx);
    return s;
}

static deft_status train_all(run *r, const config *c, const deft_cifar *train, const deft_cifar *test) {
    const deft_cifar_options o = {.layout = c->nhwc ? DEFT_NHWC : DEFT_NCHW, .crop_padding = c->augment ? 4 : 0,
                                  .flip = c->augment, .shuffle = 1, .seed = 1234};
    deft_cifar_feed *f = NULL;
    deft_loader *l = NULL;
    deft_status s = deft_cifar_feed_new(train, c->batch, &o, &f);
    if (s == DEFT_OK) s = deft_loader_new_cifar(f, r->t.x, r->t.y, 4, &l);
    for (int e = 1; s == DEFT_OK && e <= c->epochs; e++) {
        double acc = 0, t0 = seconds();
        s = train_epoch(r, l, c, e, deft_cifar_feed_batches(f));
        double t1 = seconds();
        if (s == DEFT_OK) s = evaluate(r, test, c, &acc);
        if (s == DEFT_OK)
            printf("epoch %d  test accuracy %.2f%%  (train %.1f s, eval %.1f s)\n", e, 100.0 * acc, t1 - t0,
                   seconds() - t1);
    }
    deft_loader_free(l);
    deft_cifar_feed_free(f);
    return s;
}

static const char help[] =
    "usage: resnet18_cifar [DIR] [--epochs N] [--batch B] [--lr LR] [--device cpu|cuda|cuda:N] [--nhwc]\n"
    "                      [--amp bf16] [--steps N] [--no-augment] [--synthetic N]\n"
    "\n"
    "ResNet-18 trained on CIFAR-10 with SGD (momentum 0.9, weight decay 5e-4, cosine learning rate) and\n"
    "torchvision's augmentation, with progress and the test accuracy after each epoch.\n"
    "\n"
    "  DIR                       CIFAR-10's binary files, data_batch_1.bin .. test_batch.bin\n"
    "                            (default: the environment variable DEFT_CIFAR_DIR)\n"
    "  --epochs N                epochs to train (default: 30)\n"
    "  --batch B                 images per step (default: 128)\n"
    "  --lr LR                   the peak learning rate (default: 0.1)\n"
    "  --device cpu|cuda|cuda:N  where it trains (default: cuda:0 when a GPU works, else the CPU)\n"
    "  --nhwc                    NHWC layout (default: NCHW)\n"
    "  --amp bf16                autocast to bf16 (default: off, f32)\n"
    "  --steps N                 stop each epoch after N steps (default: 0, the whole epoch)\n"
    "  --no-augment              no random crop and flip (default: augment)\n"
    "  --synthetic N             train on N generated images (and N/5 test images) instead (default: 0)\n"
    "  -h, --help                this help\n";

int main(int argc, char **argv) {
    config c;
    example_help(argc, argv, help);
    if (!parse(argc, argv, &c)) {
        fprintf(stderr, "usage: %s [DIR] [--epochs N] [--batch B] [--lr LR] [--device cpu|cuda|cuda:N] [--nhwc] "
                "[--amp bf16] [--steps N] [--no-augment] [--synthetic N]\n", argv[0]);
        return 2;
    }
    deft_device dev = deft_device_default();
    if (c.device && deft_device_parse(c.device, &dev) != DEFT_OK) {
        fprintf(stderr, "resnet18_cifar: --device %s: %s\n", c.device, deft_errmsg());
        return 1;
    }
    deft_cifar train = {0}, test = {0};
    if (!load_data(&c, &train, &test)) {
        deft_cifar_free(&train);
        deft_cifar_free(&test);
        return 1;
    }
    char dname[32];
    printf("resnet18_cifar: ResNet-18 on %s%s: %lld training and %lld test images, batch %d, lr %g, %s%s%s\n",
           c.synthetic ? "generated images" : "CIFAR-10", c.augment ? " (crop + flip)" : "", (long long)train.n,
           (long long)test.n, c.batch, c.lr, deft_device_str(dev, dname, sizeof dname), c.nhwc ? ", NHWC" : "",
           c.amp == DEFT_BF16 ? ", autocast bf16" : "");
    fflush(stdout);
    run r = {0};
    deft_status s = train.n >= c.batch ? build(&r, &c, dev, test.n) : DEFT_ERR_INVALID;
    if (s == DEFT_OK) s = train_all(&r, &c, &train, &test);
    if (s != DEFT_OK)
        fprintf(stderr, "resnet18_cifar: %s\n",
                train.n < c.batch ? "fewer training images than one batch" : deft_errmsg());
    deft_graph_free(r.t.g);
    deft_cifar_free(&train);
    deft_cifar_free(&test);
    deft_memory_release_all();   /* the caches back to the driver: leak checkers see nothing left */
    return s == DEFT_OK ? 0 : 1;
}
