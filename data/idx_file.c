/* The idx format of MNIST's files: the bytes 0x00 0x00, a type code, the number of dimensions, then each dimension as
 * a big-endian u32, then the elements, big-endian. In memory the elements are in host order. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "byte_order.h"
#include "graph_internal.h"

/* Data is read and converted in pieces of this size, so memory grows with what the file really holds, not with what
 * a (possibly corrupt) header claims. */
#define DEFT_IDX_CHUNK ((size_t)1 << 20)

static size_t deft_idx_type_size(int type) {
    switch (type) {
    case 0x08: return 1;   /* u8 */
    case 0x09: return 1;   /* i8 */
    case 0x0B: return 2;   /* i16 */
    case 0x0C: return 4;   /* i32 */
    case 0x0D: return 4;   /* f32 */
    case 0x0E: return 8;   /* f64 */
    default: return 0;
    }
}


/* The data bytes the dims describe, or DEFT_ERR_IO when that overflows a size_t (a corrupt header must not wrap
 * round to a small allocation). A zero dimension anywhere makes an empty, not an overflowing, tensor. */
static deft_status deft_idx_data_bytes(const char *what, const char *path, const deft_idx *d, size_t *out) {
    size_t bytes = deft_idx_type_size(d->type);
    for (int i = 0; i < d->ndim; i++)
        if (d->dims[i] == 0) bytes = 0;
    for (int i = 0; i < d->ndim && bytes; i++) {
        uint64_t dim = (uint64_t)d->dims[i];
        if (dim != 0 && bytes > SIZE_MAX / dim) {
            char shape[256];
            return deft_set_error(DEFT_ERR_IO, "%s: %s: the dimensions %s overflow the size of memory", what, path,
                                  deft_shape_str(d->ndim, d->dims, shape, sizeof shape));
        }
        bytes *= (size_t)dim;
    }
    *out = bytes;
    return DEFT_OK;
}

/* ---- reading ---- */

static deft_status deft_idx_read_header(FILE *f, const char *path, deft_idx *d) {
    unsigned char magic[4], dims[4 * DEFT_MAX_DIMS];
    size_t got = fread(magic, 1, sizeof magic, f);
    if (got < sizeof magic)
        return deft_set_error(DEFT_ERR_IO, "idx_read: %s: short header: the file has %zu bytes, an idx header needs at "
                              "least 4", path, got);
    if (magic[0] != 0 || magic[1] != 0)
        return deft_set_error(DEFT_ERR_IO, "idx_read: %s: bad magic: the file starts 0x%02x 0x%02x, an idx file starts "
                              "0x00 0x00", path, magic[0], magic[1]);
    d->type = magic[2];
    d->ndim = magic[3];
    if (deft_idx_type_size(d->type) == 0)
        return deft_set_error(DEFT_ERR_IO, "idx_read: %s: unknown type code 0x%02x (known: 0x08 u8, 0x09 i8, 0x0B i16, "
                              "0x0C i32, 0x0D f32, 0x0E f64)", path, (unsigned)d->type);
    if (d->ndim < 1 || d->ndim > DEFT_MAX_DIMS)
        return deft_set_error(DEFT_ERR_IO, "idx_read: %s: the header gives %d dimensions; deft reads 1 to %d", path,
                              d->ndim, DEFT_MAX_DIMS);
    size_t want = 4 * (size_t)d->ndim;
    got = fread(dims, 1, want, f);
    if (got < want)
        return deft_set_error(DEFT_ERR_IO, "idx_read: %s: short header: %d dimensions need %zu bytes after the magic, "
                              "the file has %zu", path, d->ndim, want, got);
    for (int i = 0; i < d->ndim; i++) {
        const unsigned char *b = dims + 4 * i;
        d->dims[i] = (int64_t)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3]);
    }
    return DEFT_OK;
}

/* Bytes left in f, read and dropped, to say how long an over-long file is. */
static size_t deft_count_rest(FILE *f) {
    unsigned char sink[4096];
    size_t n = 0, got;
    while ((got = fread(sink, 1, sizeof sink, f)) > 0) n += got;
    return n;
}

/* Reads into *buf (capacity *cap) until `want` bytes or the end of the file, growing the buffer as data arrives. */
static deft_status deft_idx_fill(FILE *f, const char *path, size_t want, unsigned char **buf, size_t *cap,
                                 size_t *got) {
    while (*got < want) {
        if (*got == *cap) {
            size_t grown = *cap < want - *cap ? 2 * *cap : want;
            unsigned char *p = realloc(*buf, grown);
            if (!p) return deft_set_error(DEFT_ERR_OOM, "idx_read: %s: out of host memory for %zu bytes", path, grown);
            *buf = p;
            *cap = grown;
        }
        size_t r = fread(*buf + *got, 1, *cap - *got, f);
        *got += r;
        if (r == 0) break;
    }
    if (ferror(f)) return deft_set_error(DEFT_ERR_IO, "idx_read: %s: read error: %s", path, strerror(errno));
    return DEFT_OK;
}

static deft_status deft_idx_read_data(FILE *f, const char *path, size_t want, void **out) {
    size_t cap = want < DEFT_IDX_CHUNK ? want : DEFT_IDX_CHUNK, got = 0;
    if (cap == 0) cap = 1;
    unsigned char *buf = malloc(cap);
    if (!buf) return deft_set_error(DEFT_ERR_OOM, "idx_read: %s: out of host memory for %zu bytes", path, cap);
    deft_status s = deft_idx_fill(f, path, want, &buf, &cap, &got);
    if (s == DEFT_OK && got < want)
        s = deft_set_error(DEFT_ERR_IO, "idx_read: %s: truncated: the header says %zu bytes of data, the file has %zu",
                           path, want, got);
    size_t extra = s == DEFT_OK ? deft_count_rest(f) : 0;
    if (extra)
        s = deft_set_error(DEFT_ERR_IO, "idx_read: %s: too long: the header says %zu bytes of data, the file has %zu",
                           path, want, want + extra);
    if (s != DEFT_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return DEFT_OK;
}

deft_status deft_idx_read(const char *path, deft_idx *out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return deft_set_error(DEFT_ERR_INVALID, "idx_read: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "idx_read: %s: cannot open: %s", path, strerror(errno));
    deft_idx d = {0};
    deft_status s = deft_idx_read_header(f, path, &d);
    if (s == DEFT_OK) s = deft_idx_data_bytes("idx_read", path, &d, &d.bytes);
    if (s == DEFT_OK) s = deft_idx_read_data(f, path, d.bytes, &d.data);
    fclose(f);
    if (s != DEFT_OK) return s;
    deft_elements_to_order(d.data, d.bytes, deft_idx_type_size(d.type), false);
    *out = d;
    return DEFT_OK;
}

void deft_idx_free(deft_idx *d) {
    if (!d) return;
    free(d->data);
    memset(d, 0, sizeof *d);
}

/* ---- writing ---- */

static deft_status deft_idx_check(const char *path, const deft_idx *in) {
    if (!path || !in) return deft_set_error(DEFT_ERR_INVALID, "idx_write: the path and the idx must not be NULL");
    if (deft_idx_type_size(in->type) == 0)
        return deft_set_error(DEFT_ERR_INVALID, "idx_write: %s: unknown type code 0x%02x", path, (unsigned)in->type);
    if (in->ndim < 1 || in->ndim > DEFT_MAX_DIMS)
        return deft_set_error(DEFT_ERR_INVALID, "idx_write: %s: %d dimensions; idx files have 1 to %d", path, in->ndim,
                              DEFT_MAX_DIMS);
    for (int i = 0; i < in->ndim; i++)
        if (in->dims[i] < 0 || in->dims[i] > (int64_t)UINT32_MAX)
            return deft_set_error(DEFT_ERR_INVALID, "idx_write: %s: dimension %d is %lld; idx dimensions are u32", path,
                                  i, (long long)in->dims[i]);
    size_t bytes;
    deft_status s = deft_idx_data_bytes("idx_write", path, in, &bytes);
    if (s != DEFT_OK) return deft_set_error(DEFT_ERR_INVALID, "%s", deft_errmsg());
    if (bytes != in->bytes)
        return deft_set_error(DEFT_ERR_INVALID, "idx_write: %s: bytes is %zu, the dimensions and type need %zu", path,
                              in->bytes, bytes);
    if (bytes && !in->data) return deft_set_error(DEFT_ERR_INVALID, "idx_write: %s: data is NULL", path);
    return DEFT_OK;
}

static deft_status deft_idx_put(FILE *f, const char *path, const void *p, size_t n) {
    if (n == 0 || fwrite(p, 1, n, f) == n) return DEFT_OK;
    return deft_set_error(DEFT_ERR_IO, "idx_write: %s: write failed: %s; the file is incomplete", path,
                          strerror(errno));
}

static deft_status deft_idx_write_header(FILE *f, const char *path, const deft_idx *in) {
    unsigned char head[4 + 4 * DEFT_MAX_DIMS] = {0, 0, (unsigned char)in->type, (unsigned char)in->ndim};
    for (int i = 0; i < in->ndim; i++) {
        uint32_t v = (uint32_t)in->dims[i];
        unsigned char *b = head + 4 + 4 * i;
        b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16), b[2] = (unsigned char)(v >> 8);
        b[3] = (unsigned char)v;
    }
    return deft_idx_put(f, path, head, 4 + 4 * (size_t)in->ndim);
}

/* Converts through a chunk-sized copy so the caller's data stays in host order. */
static deft_status deft_idx_write_data(FILE *f, const char *path, const deft_idx *in) {
    size_t esize = deft_idx_type_size(in->type), step = DEFT_IDX_CHUNK - DEFT_IDX_CHUNK % esize;
    unsigned char *chunk = malloc(step);
    if (!chunk) return deft_set_error(DEFT_ERR_OOM, "idx_write: %s: out of host memory", path);
    deft_status s = DEFT_OK;
    for (size_t off = 0; off < in->bytes && s == DEFT_OK; off += step) {
        size_t n = in->bytes - off < step ? in->bytes - off : step;
        memcpy(chunk, (const unsigned char *)in->data + off, n);
        deft_elements_to_order(chunk, n, esize, false);
        s = deft_idx_put(f, path, chunk, n);
    }
    free(chunk);
    return s;
}

deft_status deft_idx_write(const char *path, const deft_idx *in) {
    deft_status s = deft_idx_check(path, in);
    if (s != DEFT_OK) return s;
    FILE *f = fopen(path, "wb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "idx_write: %s: cannot open for writing: %s", path, strerror(errno));
    s = deft_idx_write_header(f, path, in);
    if (s == DEFT_OK) s = deft_idx_write_data(f, path, in);
    /* fclose flushes the last buffered bytes: a full disk may only show here. */
    if (fclose(f) != 0 && s == DEFT_OK)
        s = deft_set_error(DEFT_ERR_IO, "idx_write: %s: closing failed: %s; the file is incomplete", path,
                           strerror(errno));
    return s;
}
