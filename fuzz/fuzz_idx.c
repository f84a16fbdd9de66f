/* libFuzzer target: deft_idx_read on any bytes, then what a file that reads can go through: deft_idx_write and a
 * second read give it back unchanged, and as the images (u8, 2 or more dimensions) or the labels (u8, 1 dimension)
 * of a dataset, with a partner file written by deft_idx_write, deft_dataset_load_idx and a batch.
 * Seeds (--write-seeds DIR): deft_idx_write of every element type, an images and a labels file. */
#include "fuzz_common.h"

static int64_t numel(const deft_idx *d) {
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->dims[i];
    return n;
}

static void write_one(const char *dir, const char *name, int type, size_t esize, int ndim, const int64_t *dims) {
    deft_idx d = {.type = type, .ndim = ndim};
    memcpy(d.dims, dims, sizeof(int64_t) * (size_t)ndim);
    d.bytes = (size_t)numel(&d) * esize;
    d.data = malloc(d.bytes ? d.bytes : 1);
    for (size_t i = 0; i < d.bytes; i++) ((unsigned char *)d.data)[i] = (unsigned char)(i * 37 + 11);
    const char *tmp = deft_fuzz_path("seed.idx");
    if (deft_idx_write(tmp, &d) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    deft_fuzz_seed_file(dir, name, tmp);
    free(d.data);
}

static void write_seeds(const char *dir) {
    write_one(dir, "u8_images.idx", 0x08, 1, 3, (const int64_t[]){4, 3, 3});
    write_one(dir, "u8_labels.idx", 0x08, 1, 1, (const int64_t[]){4});
    write_one(dir, "i8.idx", 0x09, 1, 1, (const int64_t[]){5});
    write_one(dir, "i16.idx", 0x0B, 2, 2, (const int64_t[]){2, 2});
    write_one(dir, "i32.idx", 0x0C, 4, 3, (const int64_t[]){3, 1, 2});
    write_one(dir, "f32.idx", 0x0D, 4, 2, (const int64_t[]){2, 3});
    write_one(dir, "f64.idx", 0x0E, 8, 1, (const int64_t[]){4});
    write_one(dir, "empty.idx", 0x08, 1, 2, (const int64_t[]){0, 7});
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    deft_fuzz_start(argc, argv, write_seeds);
    return 0;
}

/* Writes d back and reads it again: the same type, dimensions and bytes. */
static void round_trip(const deft_idx *d) {
    const char *again = deft_fuzz_path("again.idx");
    FUZZ_ASSERT(deft_idx_write(again, d) == DEFT_OK);
    deft_idx e;
    FUZZ_ASSERT(deft_idx_read(again, &e) == DEFT_OK);
    FUZZ_ASSERT(e.type == d->type && e.ndim == d->ndim && e.bytes == d->bytes);
    FUZZ_ASSERT(memcmp(e.dims, d->dims, sizeof(int64_t) * (size_t)d->ndim) == 0);
    FUZZ_ASSERT(e.bytes == 0 || memcmp(e.data, d->data, e.bytes) == 0);
    deft_idx_free(&e);
}

/* The first batch of up to 4 samples, the first epoch's order shuffled. */
static void batch(const deft_dataset *ds) {
    int64_t b = ds->n < 4 ? ds->n : 4;
    if (b < 1 || ds->features > (1 << 16)) return;
    float *x = malloc(sizeof(float) * (size_t)(b * ds->features) + 1);
    int32_t y[4];
    int64_t *order = malloc(sizeof(int64_t) * (size_t)ds->n);
    FUZZ_ASSERT(x && order);
    FUZZ_ASSERT(deft_shuffle(order, ds->n, 1) == DEFT_OK);
    FUZZ_ASSERT(deft_dataset_batch(ds, order, 0, b, x, y) == DEFT_OK);
    for (int64_t i = 0; i < b; i++) FUZZ_ASSERT(y[i] >= 0 && y[i] < ds->n_classes);
    FUZZ_ASSERT(deft_dataset_batch(ds, order, ds->n - b + 1, b, x, y) == DEFT_ERR_INVALID);
    free(order);
    free(x);
}

/* The input as one file of a dataset, its partner written here with as many samples. */
static void as_dataset(const char *path, const deft_idx *d) {
    if (d->type != 0x08 || d->dims[0] > (1 << 16)) return;
    const int64_t n = d->dims[0];
    deft_idx other = {.type = 0x08, .ndim = d->ndim == 1 ? 2 : 1, .dims = {n, 2}};
    other.bytes = (size_t)(other.ndim == 2 ? 2 * n : n);
    other.data = malloc(other.bytes ? other.bytes : 1);
    FUZZ_ASSERT(other.data);
    for (size_t i = 0; i < other.bytes; i++) ((unsigned char *)other.data)[i] = (unsigned char)(i % 10);
    const char *partner = deft_fuzz_path("partner.idx");
    FUZZ_ASSERT(deft_idx_write(partner, &other) == DEFT_OK);
    free(other.data);
    deft_dataset ds;
    deft_status s = d->ndim == 1 ? deft_dataset_load_idx(partner, path, &ds) : deft_dataset_load_idx(path, partner, &ds);
    if (s == DEFT_OK) {
        FUZZ_ASSERT(ds.n == n);
        batch(&ds);
    } else {
        FUZZ_ASSERT(s == DEFT_ERR_IO || s == DEFT_ERR_INVALID || s == DEFT_ERR_OOM);
    }
    deft_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = deft_fuzz_path("input.idx");
    deft_fuzz_write(path, data, size);
    deft_idx d;
    deft_status s = deft_idx_read(path, &d);
    if (s != DEFT_OK) {
        FUZZ_ASSERT(s == DEFT_ERR_IO || s == DEFT_ERR_OOM);
        FUZZ_ASSERT(d.data == NULL && d.bytes == 0);
        return 0;
    }
    FUZZ_ASSERT(d.ndim >= 1 && d.ndim <= DEFT_MAX_DIMS && d.bytes <= size);
    round_trip(&d);
    as_dataset(path, &d);
    deft_idx_free(&d);
    return 0;
}
