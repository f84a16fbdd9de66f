/* What deft's own binary files (parameter files, training state) share: CRC-32, little-endian fields, and reading and
 * writing with messages that name the caller, the file and what went wrong (data/file_format.c). */
#ifndef DEFT_FILE_FORMAT_H
#define DEFT_FILE_FORMAT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base.h"

/* CRC-32 (IEEE 802.3, the polynomial of zlib and PNG) of n bytes, continuing `crc` (0 to start): so that
 * deft_crc32_update(deft_crc32_update(0, a), b) is the CRC of a followed by b. */
uint32_t deft_crc32_update(uint32_t crc, const void *data, size_t n);
static inline uint32_t deft_crc32(const void *data, size_t n) { return deft_crc32_update(0, data, n); }

/* Returns n, so that a caller can advance its position by it. */
static inline size_t deft_put_le(unsigned char *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    return (size_t)n;
}

static inline uint64_t deft_get_le(const unsigned char *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* A file being read: messages start "<who>: <path>: ". */
typedef struct deft_file_reader {
    FILE *f;
    const char *who, *path;
    uint64_t offset;              /* bytes read so far, for messages */
} deft_file_reader;

/* Reads exactly n bytes; running out is DEFT_ERR_IO "truncated", saying in what. */
deft_status deft_file_read(deft_file_reader *r, void *p, size_t n, const char *what);
deft_status deft_file_read_le(deft_file_reader *r, int n, uint64_t *v, const char *what);
/* Reads a stored CRC-32 (in `what`) and compares it with the one of the n bytes at p: a mismatch is DEFT_ERR_IO
 * "checksum mismatch in <in>". */
deft_status deft_file_check_crc(deft_file_reader *r, const void *p, size_t n, const char *what, const char *in);
/* DEFT_ERR_IO unless the file ends here ("trailing bytes after <after>"). */
deft_status deft_file_expect_end(deft_file_reader *r, const char *after);

/* A file being written: a failure is DEFT_ERR_IO "<who>: <path>: write failed: <why>; <after_failure>". */
typedef struct deft_file_writer {
    FILE *f;
    const char *who, *path, *after_failure;
} deft_file_writer;

deft_status deft_file_write(deft_file_writer *w, const void *p, size_t n);
/* Writes the little-endian CRC-32 of the n bytes at p. */
deft_status deft_file_write_crc(deft_file_writer *w, const void *p, size_t n);

#endif
