/* CIFAR-10's binary files: each record is one label byte (0..9) and 3072 pixel bytes (the red, green and blue planes
 * of a 32x32 image, row-major). A file holds whole records only; data_batch_1..5.bin are the training set and
 * test_batch.bin the test set. The pixels stay bytes in memory (a quarter of their f32 size) until a batch is made. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "path.h"

#define DEFT_CIFAR_RECORD (1 + DEFT_CIFAR_IMAGE_BYTES)
#define DEFT_CIFAR_TRAIN_FILES 5

/* The size of an open file, or -1 with a message. */
static long deft_cifar_file_size(FILE *f, const char *path) {
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        deft_set_error(DEFT_ERR_IO, "cifar_read: %s: cannot find the file's size: %s", path, strerror(errno));
    return size;
}

static deft_status deft_cifar_check_size(const char *path, long size) {
    if (size == 0)
        return deft_set_error(DEFT_ERR_IO, "cifar_read: %s: the file is empty; a CIFAR-10 binary file holds records "
                              "of %d bytes (1 label byte + %d pixel bytes)", path, DEFT_CIFAR_RECORD,
                              DEFT_CIFAR_IMAGE_BYTES);
    if (size % DEFT_CIFAR_RECORD != 0)
        return deft_set_error(DEFT_ERR_IO, "cifar_read: %s: truncated or not a CIFAR-10 binary file: %ld bytes are %ld "
                              "whole records of %d bytes (1 label byte + %d pixel bytes) and %ld bytes more",
                              path, size, size / DEFT_CIFAR_RECORD, DEFT_CIFAR_RECORD, DEFT_CIFAR_IMAGE_BYTES,
                              size % DEFT_CIFAR_RECORD);
    return DEFT_OK;
}

static deft_status deft_cifar_grow(deft_cifar *d, int64_t more) {
    size_t n = (size_t)(d->n + more);
    if (n > SIZE_MAX / DEFT_CIFAR_IMAGE_BYTES)
        return deft_set_error(DEFT_ERR_OOM, "cifar_read: %zu images are too many for host memory", n);
    uint8_t *px = realloc(d->pixels, n * DEFT_CIFAR_IMAGE_BYTES);
    if (px) d->pixels = px;
    int32_t *lb = px ? realloc(d->labels, n * sizeof *lb) : NULL;
    if (lb) d->labels = lb;
    if (!px || !lb) return deft_set_error(DEFT_ERR_OOM, "cifar_read: out of host memory for %zu images", n);
    return DEFT_OK;
}

/* Reads the records one at a time into the end of d, checking every label. */
static deft_status deft_cifar_read_records(FILE *f, const char *path, int64_t records, deft_cifar *d) {
    unsigned char rec[DEFT_CIFAR_RECORD];
    for (int64_t r = 0; r < records; r++) {
        if (fread(rec, 1, sizeof rec, f) != sizeof rec)
            return deft_set_error(DEFT_ERR_IO, "cifar_read: %s: reading record %lld failed: %s", path, (long long)r,
                                  ferror(f) ? strerror(errno) : "the file ended early");
        if (rec[0] >= DEFT_CIFAR_CLASSES)
            return deft_set_error(DEFT_ERR_IO, "cifar_read: %s: record %lld (byte offset %lld) has label %u; CIFAR-10 "
                                  "labels are 0 to %d", path, (long long)r, (long long)r * DEFT_CIFAR_RECORD,
                                  (unsigned)rec[0], DEFT_CIFAR_CLASSES - 1);
        d->labels[d->n] = rec[0];
        memcpy(d->pixels + (size_t)d->n * DEFT_CIFAR_IMAGE_BYTES, rec + 1, DEFT_CIFAR_IMAGE_BYTES);
        d->n++;
    }
    return DEFT_OK;
}

static deft_status deft_cifar_append_file(const char *path, deft_cifar *d) {
    if (!path) return deft_set_error(DEFT_ERR_INVALID, "cifar_read: a path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "cifar_read: %s: cannot open: %s", path, strerror(errno));
    long size = deft_cifar_file_size(f, path);
    deft_status s = size < 0 ? DEFT_ERR_IO : deft_cifar_check_size(path, size);
    int64_t records = size > 0 ? size / DEFT_CIFAR_RECORD : 0;
    if (s == DEFT_OK) s = deft_cifar_grow(d, records);
    if (s == DEFT_OK) s = deft_cifar_read_records(f, path, records, d);
    fclose(f);
    return s;
}

deft_status deft_cifar_read(const char *const *paths, int n_paths, deft_cifar *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "cifar_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!paths || n_paths < 1)
        return deft_set_error(DEFT_ERR_INVALID, "cifar_read: %d paths given (at least 1 is needed)", n_paths);
    deft_status s = DEFT_OK;
    for (int i = 0; i < n_paths && s == DEFT_OK; i++) s = deft_cifar_append_file(paths[i], out);
    if (s != DEFT_OK) deft_cifar_free(out);
    return s;
}

deft_status deft_cifar_load(const char *dir, int train, deft_cifar *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "cifar_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!dir) return deft_set_error(DEFT_ERR_INVALID, "cifar_load: dir is NULL");
    char names[DEFT_CIFAR_TRAIN_FILES][DEFT_PATH_MAX];
    const char *paths[DEFT_CIFAR_TRAIN_FILES];
    int n = train ? DEFT_CIFAR_TRAIN_FILES : 1;
    for (int i = 0; i < n; i++) {
        deft_status s = train ? deft_path_format(names[i], sizeof names[i], "cifar_load", "%s/data_batch_%d.bin",
                                                 dir, i + 1)
                              : deft_path_format(names[i], sizeof names[i], "cifar_load", "%s/test_batch.bin", dir);
        if (s != DEFT_OK) return s;
        paths[i] = names[i];
    }
    return deft_cifar_read(paths, n, out);
}

void deft_cifar_free(deft_cifar *d) {
    if (!d) return;
    free(d->pixels);
    free(d->labels);
    memset(d, 0, sizeof *d);
}
