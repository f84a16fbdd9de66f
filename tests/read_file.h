/* Whole files in and out of memory: the tests that write a file through the library (DOT dumps, memory snapshots
 * and histories, parameter and training-state files) read it back this way to look at what was written, and write
 * damaged copies of it back to see them refused. */
#ifndef DEFT_TEST_READ_FILE_H
#define DEFT_TEST_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

#include "check.h"

/* The file's bytes with a NUL after them (malloc'd), or NULL when it cannot be opened or memory runs out; a short
 * read gives the empty string. */
static inline char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* The file's bytes (malloc'd; *n their count), or NULL when it cannot be opened: read to its end, so a file that
 * grows or shrinks meanwhile gives what was there. */
static inline unsigned char *read_file_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            buf = realloc(buf, cap);
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    *n = len;
    return buf;
}

/* Writes the n bytes at data as the whole file (a failed check when it cannot). */
static inline void write_file_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

#endif
