/* Reads a whole file into memory: the tests that write a file through the library (DOT dumps, memory snapshots
 * and histories)
 * read it back this way to look at what was written. */
#ifndef DEFT_TEST_READ_FILE_H
#define DEFT_TEST_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
