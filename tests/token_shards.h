/* Token shards for the tests, written byte by byte here rather than through deft_tokens_write, so that the reader is
 * checked against a writer of its own and any header field can be wrong or the file cut short or run long; the
 * directory of a test's shards; and a program that shows what a token loader fed it. The includer defines
 * _POSIX_C_SOURCE (getpid, mkdir). */
#ifndef DEFT_TEST_TOKEN_SHARDS_H
#define DEFT_TEST_TOKEN_SHARDS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "xorshift.h"

#define SHARD_MAGIC 20240520
#define SHARD_HEADER 1024

typedef struct shard_spec {
    int32_t magic, version, count;   /* the header's fields */
    long keep;                       /* bytes of the file to keep, -1 for all */
    int extra;                       /* bytes appended after the tokens */
} shard_spec;

/* A well-formed header for n tokens. */
static inline shard_spec shard_ok(int64_t n) {
    return (shard_spec){.magic = SHARD_MAGIC, .version = 1, .count = (int32_t)n, .keep = -1};
}

static inline void shard_put_le(unsigned char *b, uint32_t v, int bytes) {
    for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* Writes the header of `s` and the n tokens (each taken mod 65536); 0 on success. */
static inline int shard_write(const char *path, shard_spec s, const int32_t *tokens, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char head[SHARD_HEADER] = {0};
    shard_put_le(head, (uint32_t)s.magic, 4);
    shard_put_le(head + 4, (uint32_t)s.version, 4);
    shard_put_le(head + 8, (uint32_t)s.count, 4);
    long written = 0;
    int bad = 0;
    for (int64_t i = -1; i < n; i++) {
        unsigned char tok[2];
        const unsigned char *p = head;
        long len = SHARD_HEADER;
        if (i >= 0) shard_put_le(tok, (uint32_t)tokens[i] & 0xffffu, 2), p = tok, len = 2;
        if (s.keep >= 0 && written + len > s.keep) len = s.keep - written > 0 ? s.keep - written : 0;
        bad |= len > 0 && fwrite(p, 1, (size_t)len, f) != (size_t)len;
        written += len;
    }
    for (int i = 0; i < s.extra; i++) bad |= fputc(0x5a, f) == EOF;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

/* n tokens drawn from seed in [0, 65536): every bit of a uint16 is used, so a byte-order slip shows. */
static inline void shard_random_tokens(int32_t *t, int64_t n, uint64_t seed) {
    uint64_t s = seed | 1;
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(xorshift64(&s) & 0xffffu);
}

/* A directory of this process for a test's shards, "<prefix>_<pid>" in dir (cap bytes): 0 when it was made. */
static inline int shard_dir_make(char *dir, size_t cap, const char *prefix) {
    snprintf(dir, cap, "%s_%d", prefix, (int)getpid());
    return mkdir(dir, 0755);
}

/* Removes the directory and everything in it: 0 on success. */
static inline int shard_dir_remove(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

/* x and y, i32 [b, t] inputs "tokens" and "targets" on a device, passed through to xo and yo: what a loader fed is
 * what the program gives back. */
typedef struct token_net {
    deft_graph *g;
    deft_tensor *x, *y, *xo, *yo;
    deft_program *p;
    int64_t b, t;
} token_net;

static inline void token_net_build(token_net *n, int64_t b, int64_t t, deft_device dev) {
    n->b = b;
    n->t = t;
    n->g = deft_graph_new();
    n->x = deft_input(n->g, "tokens", DEFT_I32, 2, (int64_t[]){b, t}, dev);
    n->y = deft_input(n->g, "targets", DEFT_I32, 2, (int64_t[]){b, t}, dev);
    n->xo = deft_add_scalar(n->x, 0.0);
    n->yo = deft_add_scalar(n->y, 0.0);
    n->p = deft_compile(n->g, (deft_tensor *[]){n->xo, n->yo}, 2, NULL);
    CHECK_MSG(n->p != NULL, "compile: %s", deft_errmsg());
}

/* The next batch from the loader, run through the program; its (epoch, index) and, unless it is an epoch's end,
 * the x and y (b * t each) the program saw. */
static inline deft_loader_batch token_net_next(token_net *n, deft_loader *l, int32_t *x, int32_t *y) {
    deft_loader_batch bt = {0};
    CHECK_OK(deft_loader_next(l, n->p, &bt));
    if (bt.end) return bt;
    const size_t bytes = (size_t)(n->b * n->t) * sizeof *x;
    CHECK_OK(deft_program_run(n->p));
    CHECK_OK(deft_program_read(n->p, n->xo, x, bytes));
    CHECK_OK(deft_program_read(n->p, n->yo, y, bytes));
    return bt;
}

#endif
