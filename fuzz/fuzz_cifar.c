/* libFuzzer target: deft_cifar_load on any bytes as <dir>/test_batch.bin, then deft_cifar_read of the same file twice
 * and, for a file that reads, batches and a feed with options taken from its first pixels (some out of range, which
 * must be refused), and an augmentation that stays inside the padding.
 * Seeds (--write-seeds DIR): files of CIFAR-10's binary format (one label byte, 3072 pixel bytes per record), as
 * tests/test_cifar.c writes them; the library has no CIFAR writer. */
#include "fuzz_common.h"

#define REC (1 + DEFT_CIFAR_IMAGE_BYTES)

static void write_records(const char *dir, const char *name, int n, int first) {
    static unsigned char buf[4 * REC];
    for (int r = 0; r < n; r++) {
        buf[r * REC] = (unsigned char)((first + r) % DEFT_CIFAR_CLASSES);
        for (int k = 0; k < DEFT_CIFAR_IMAGE_BYTES; k++) buf[r * REC + 1 + k] = (unsigned char)((first + r) * 131 + k * 7);
    }
    deft_fuzz_seed_bytes(dir, name, buf, (size_t)n * REC);
}

static void write_seeds(const char *dir) {
    write_records(dir, "one.bin", 1, 0);
    write_records(dir, "two.bin", 2, 3);
    write_records(dir, "four.bin", 4, 9);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    deft_fuzz_start(argc, argv, write_seeds);
    return 0;
}

/* Options from the first record's pixels: a layout or padding out of range now and then. */
static deft_cifar_options options_of(const deft_cifar *d) {
    const uint8_t *px = d->pixels;
    deft_cifar_options o = {.layout = (deft_layout)(px[0] % 3), .crop_padding = px[1] % 20 - 1, .flip = px[2] & 1,
                            .shuffle = px[3] & 1, .seed = px[4]};
    return o;
}

static void batches(const deft_cifar *d) {
    const deft_cifar_options o = options_of(d);
    const int valid = o.layout != 2 && o.crop_padding >= 0 && o.crop_padding <= 16;
    const int64_t b = d->n < 3 ? d->n : 3, epoch = d->pixels[5];
    float *x = malloc(sizeof(float) * (size_t)b * DEFT_CIFAR_IMAGE_BYTES);
    int32_t y[3];
    FUZZ_ASSERT(x);
    deft_status s = deft_cifar_batch(d, NULL, 0, b, &o, epoch, x, y);
    FUZZ_ASSERT(valid ? s == DEFT_OK : s == DEFT_ERR_INVALID);
    for (int64_t i = 0; s == DEFT_OK && i < b; i++) FUZZ_ASSERT(y[i] == d->labels[i]);
    FUZZ_ASSERT(deft_cifar_batch(d, NULL, d->n, 1, &o, epoch, x, y) == DEFT_ERR_INVALID);
    for (int64_t k = 0; valid && k < d->n; k++) {
        deft_cifar_augmentation a = deft_cifar_augment_draw(&o, epoch, k);
        FUZZ_ASSERT(a.dy >= -o.crop_padding && a.dy <= o.crop_padding && a.dx >= -o.crop_padding &&
                    a.dx <= o.crop_padding);
    }
    deft_cifar_feed *f = NULL;
    s = deft_cifar_feed_new(d, b, &o, &f);
    FUZZ_ASSERT(valid ? s == DEFT_OK : s == DEFT_ERR_INVALID && f == NULL);
    if (f) {
        void *buffers[2] = {x, y};
        FUZZ_ASSERT(deft_cifar_feed_batches(f) == d->n / b);
        FUZZ_ASSERT(deft_cifar_feed_fill(f, epoch, 0, buffers) == DEFT_OK);
        FUZZ_ASSERT(deft_cifar_feed_fill(f, epoch, deft_cifar_feed_batches(f), buffers) != DEFT_OK);
        deft_cifar_feed_free(f);
    }
    free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = deft_fuzz_path("test_batch.bin");
    deft_fuzz_write(path, data, size);
    deft_cifar d;
    deft_status s = deft_cifar_load(deft_fuzz_scratch_dir(), 0, &d);
    if (s != DEFT_OK) {
        FUZZ_ASSERT(s == DEFT_ERR_IO || s == DEFT_ERR_OOM);
        FUZZ_ASSERT(d.n == 0 && d.pixels == NULL && d.labels == NULL);
        return 0;
    }
    FUZZ_ASSERT(size % REC == 0 && d.n == (int64_t)(size / REC) && d.n > 0);
    for (int64_t i = 0; i < d.n; i++) FUZZ_ASSERT(d.labels[i] >= 0 && d.labels[i] < DEFT_CIFAR_CLASSES);
    deft_cifar twice;
    FUZZ_ASSERT(deft_cifar_read((const char *[]){path, path}, 2, &twice) == DEFT_OK && twice.n == 2 * d.n);
    FUZZ_ASSERT(memcmp(twice.pixels + (size_t)d.n * DEFT_CIFAR_IMAGE_BYTES, d.pixels,
                       (size_t)d.n * DEFT_CIFAR_IMAGE_BYTES) == 0);
    deft_cifar_free(&twice);
    batches(&d);
    deft_cifar_free(&d);
    return 0;
}
