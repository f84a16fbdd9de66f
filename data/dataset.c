/* Classification datasets from idx files (MNIST's layout), batches in a given order, and seeded shuffles. */
#include <stdlib.h>
#include <string.h>

#include "batch_range.h"
#include "graph_internal.h"

#define DEFT_IDX_U8 0x08

/* ---- loading ---- */

/* Images: u8 [n, rows, cols] or [n, features] (any trailing dims are flattened into features). */
static deft_status deft_check_images(const char *path, const deft_idx *im) {
    char shape[256];
    if (im->type != DEFT_IDX_U8 || im->ndim < 2)
        return deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: %s: images must be u8 (type 0x08) [n, rows, cols] "
                              "or [n, features]; the file has type 0x%02x %s", path, (unsigned)im->type,
                              deft_shape_str(im->ndim, im->dims, shape, sizeof shape));
    if (im->dims[0] == 0 || im->bytes == 0)
        return deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: %s: the images %s are empty", path,
                              deft_shape_str(im->ndim, im->dims, shape, sizeof shape));
    return DEFT_OK;
}

static deft_status deft_check_labels(const char *path, const deft_idx *lb) {
    char shape[256];
    if (lb->type != DEFT_IDX_U8 || lb->ndim != 1)
        return deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: %s: labels must be u8 (type 0x08) [n]; the file has "
                              "type 0x%02x %s", path, (unsigned)lb->type,
                              deft_shape_str(lb->ndim, lb->dims, shape, sizeof shape));
    return DEFT_OK;
}

static deft_status deft_check_pair(const char *images_path, const deft_idx *im, const char *labels_path,
                                   const deft_idx *lb) {
    deft_status s = deft_check_images(images_path, im);
    if (s == DEFT_OK) s = deft_check_labels(labels_path, lb);
    if (s == DEFT_OK && im->dims[0] != lb->dims[0])
        s = deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: %s has %lld images but %s has %lld labels", images_path,
                           (long long)im->dims[0], labels_path, (long long)lb->dims[0]);
    return s;
}

/* Scales bytes to [0, 1] and widens labels, the forms a network's input and cross-entropy's targets take. */
static deft_status deft_dataset_fill(const deft_idx *im, const deft_idx *lb, deft_dataset *d) {
    d->n = im->dims[0];
    d->features = (int64_t)(im->bytes / (size_t)d->n);
    if (im->bytes > SIZE_MAX / sizeof *d->images)
        return deft_set_error(DEFT_ERR_OOM, "dataset_load_idx: %zu images bytes are too many to hold as f32",
                              im->bytes);
    d->images = malloc(im->bytes * sizeof *d->images);
    d->labels = malloc((size_t)d->n * sizeof *d->labels);
    if (!d->images || !d->labels)
        return deft_set_error(DEFT_ERR_OOM, "dataset_load_idx: out of host memory for %lld samples", (long long)d->n);
    const unsigned char *px = im->data, *lab = lb->data;
    for (size_t i = 0; i < im->bytes; i++) d->images[i] = (float)px[i] / 255.0f;
    int largest = 0;
    for (int64_t i = 0; i < d->n; i++) {
        d->labels[i] = lab[i];
        if (lab[i] > largest) largest = lab[i];
    }
    d->n_classes = 1 + largest;
    return DEFT_OK;
}

deft_status deft_dataset_load_idx(const char *images_path, const char *labels_path, deft_dataset *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: out is NULL");
    memset(out, 0, sizeof *out);
    if (!images_path || !labels_path)
        return deft_set_error(DEFT_ERR_INVALID, "dataset_load_idx: the images and labels paths must not be NULL");
    deft_idx im = {0}, lb = {0};
    deft_status s = deft_idx_read(images_path, &im);
    if (s == DEFT_OK) s = deft_idx_read(labels_path, &lb);
    if (s == DEFT_OK) s = deft_check_pair(images_path, &im, labels_path, &lb);
    if (s == DEFT_OK) s = deft_dataset_fill(&im, &lb, out);
    if (s != DEFT_OK) deft_dataset_free(out);
    deft_idx_free(&im);
    deft_idx_free(&lb);
    return s;
}

void deft_dataset_free(deft_dataset *d) {
    if (!d) return;
    free(d->images);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* ---- batches ---- */

deft_status deft_batch_range_check(const char *what, int64_t n, const int64_t *order, int64_t start, int64_t batch) {
    if (start < 0 || batch < 1 || start > n - batch)
        return deft_set_error(DEFT_ERR_INVALID, "%s: samples [%lld, %lld + %lld) are out of the dataset's [0, %lld); "
                              "batch must be >= 1", what, (long long)start, (long long)start, (long long)batch,
                              (long long)n);
    for (int64_t i = start; order && i < start + batch; i++)
        if (order[i] < 0 || order[i] >= n)
            return deft_set_error(DEFT_ERR_INVALID, "%s: order[%lld] is %lld, out of [0, %lld)", what, (long long)i,
                                  (long long)order[i], (long long)n);
    return DEFT_OK;
}

/* Checks everything before copying anything, so a bad call leaves x and y as they were. */
static deft_status deft_batch_check(const deft_dataset *d, const int64_t *order, int64_t start, int64_t batch,
                                    const float *x, const int32_t *y) {
    if (!d || !x || !y || !d->images || !d->labels)
        return deft_set_error(DEFT_ERR_INVALID, "dataset_batch: the dataset, x and y must not be NULL");
    return deft_batch_range_check("dataset_batch", d->n, order, start, batch);
}

deft_status deft_dataset_batch(const deft_dataset *d, const int64_t *order, int64_t start, int64_t batch, float *x,
                               int32_t *y) {
    deft_status s = deft_batch_check(d, order, start, batch, x, y);
    if (s != DEFT_OK) return s;
    size_t row = (size_t)d->features;
    for (int64_t i = 0; i < batch; i++) {
        int64_t k = order ? order[start + i] : start + i;
        memcpy(x + (size_t)i * row, d->images + (size_t)k * row, row * sizeof *x);
        y[i] = d->labels[k];
    }
    return DEFT_OK;
}

/* ---- shuffling ---- */

/* splitmix64 (Steele, Lea and Flood): small, fast, and well mixed from any seed, 0 included. */
static uint64_t deft_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, bound): draws below 2^64 mod bound are rejected, since a plain modulo would favour small values. */
static uint64_t deft_below(uint64_t *state, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = deft_splitmix64(state);
        if (r >= threshold) return r % bound;
    }
}

deft_status deft_shuffle(int64_t *order, int64_t n, uint64_t seed) {
    if (n < 0) return deft_set_error(DEFT_ERR_INVALID, "shuffle: n is %lld", (long long)n);
    if (!order && n > 0) return deft_set_error(DEFT_ERR_INVALID, "shuffle: order is NULL for %lld entries", (long long)n);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    uint64_t state = seed;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)deft_below(&state, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    return DEFT_OK;
}
