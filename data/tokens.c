/* Token shards in llm.c's format: a header of 256 little-endian int32 (magic, version, token count) and the tokens
 * as little-endian uint16. A set of shards (one file, a directory or a glob pattern) is one stream of tokens.
 *
 * Shards are mapped read-only rather than read: a GPT-2 training set is billions of tokens in shards of hundreds of
 * megabytes, and a loader reads windows of a few thousand tokens from anywhere in them. Mapping keeps no descriptor
 * open per shard (sets of thousands of shards stay under the open-file limit) and lets any number of threads read
 * at once without a shared file position. */
#define _POSIX_C_SOURCE 200809L /* glob, mmap, strdup */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checked.h"
#include "graph_internal.h"
#include "path.h"

#define DEFT_TOKENS_TOKEN_BYTES 2
/* llm.c's Llama 3 shards: uint32 tokens, named in the message so that such a file is recognised. */
#define DEFT_TOKENS_LLAMA3_MAGIC 20240801
/* Tokens converted per write when saving, so the caller's array is never changed nor copied whole. */
#define DEFT_TOKENS_WRITE_CHUNK 65536

typedef struct deft_token_shard {
    char *path;
    const unsigned char *map;   /* the whole file, header included */
    size_t map_bytes;
    int64_t first, count;       /* its tokens are [first, first + count) of the stream */
} deft_token_shard;

struct deft_tokens {
    int n_shards;
    deft_token_shard *shards;
    int64_t count;
};

static int32_t deft_le_i32(const unsigned char *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

/* ---- one shard ---- */

/* The header's fields against the format; `bytes` is the file's size and `b` its first min(bytes, 1024) bytes.
 * The magic and version come first, so that a foreign file is called foreign rather than truncated. */
static deft_status deft_shard_check_head(const char *path, const unsigned char *b, int64_t bytes, int64_t *count) {
    if (bytes >= 4 && deft_le_i32(b) != DEFT_TOKENS_MAGIC)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: bad magic %d: not a token shard (llm.c's GPT-2 shards "
                              "start with the int32 %d)%s", path, deft_le_i32(b), DEFT_TOKENS_MAGIC,
                              deft_le_i32(b) == DEFT_TOKENS_LLAMA3_MAGIC ? "; this is a Llama 3 shard of uint32 "
                              "tokens, which deft does not read" : "");
    if (bytes >= 8 && deft_le_i32(b + 4) != DEFT_TOKENS_VERSION)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: version %d; deft reads version %d (uint16 tokens)", path,
                              deft_le_i32(b + 4), DEFT_TOKENS_VERSION);
    if (bytes < DEFT_TOKENS_HEADER_BYTES)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: truncated: the file has %lld bytes, a token shard's "
                              "header alone has %d", path, (long long)bytes, DEFT_TOKENS_HEADER_BYTES);
    const int32_t n = deft_le_i32(b + 8);
    if (n < 0)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: the header gives %d tokens; the file is corrupt", path, n);
    int64_t want;
    if (!deft_i64_mul(n, DEFT_TOKENS_TOKEN_BYTES, &want) || !deft_i64_add(want, DEFT_TOKENS_HEADER_BYTES, &want))
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: the header's %d tokens overflow a file size", path, n);
    if (bytes != want)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: %s: the header says %d tokens (%lld bytes with the "
                              "header), the file has %lld bytes", path, bytes < want ? "truncated" : "too long", n,
                              (long long)want, (long long)bytes);
    *count = n;
    return DEFT_OK;
}

/* The size of the open file, which must be a regular one (a pipe or a device cannot be mapped). */
static deft_status deft_shard_size(int fd, const char *path, int64_t *bytes) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: cannot find the file's size: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: not a regular file%s", path,
                              S_ISDIR(st.st_mode) ? " (a directory)" : "");
    if (st.st_size == 0)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: the file is empty; a token shard starts with a header "
                              "of %d bytes", path, DEFT_TOKENS_HEADER_BYTES);
    if ((uint64_t)st.st_size > DEFT_MAX_BYTES)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: %lld bytes are too many to map", path,
                              (long long)st.st_size);
    *bytes = (int64_t)st.st_size;
    return DEFT_OK;
}

static deft_status deft_shard_map(int fd, const char *path, deft_token_shard *sh) {
    int64_t bytes = 0;
    deft_status s = deft_shard_size(fd, path, &bytes);
    if (s != DEFT_OK) return s;
    void *map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: cannot map %lld bytes: %s", path, (long long)bytes,
                              strerror(errno));
    sh->map = map;
    sh->map_bytes = (size_t)bytes;
    return deft_shard_check_head(path, sh->map, bytes, &sh->count);
}

/* Takes ownership of path (freed with the shard). On failure the shard keeps what it holds for deft_tokens_close. */
static deft_status deft_shard_open(char *path, deft_token_shard *sh) {
    sh->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: cannot open: %s", path, strerror(errno));
    deft_status s = deft_shard_map(fd, path, sh);
    close(fd);   /* a mapping outlives its descriptor */
    return s;
}

/* ---- the set of files ---- */

static int deft_path_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int deft_has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* The paths a pattern names, copied and sorted by strcmp (glob's own order follows the locale). */
static deft_status deft_tokens_glob(const char *pattern, const char *shown, int is_dir, char ***paths, int *n) {
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH)
        return deft_set_error(DEFT_ERR_IO, is_dir ? "tokens_open: %s: the directory has no *.bin shards"
                                                  : "tokens_open: %s: no file matches the pattern", shown);
    if (r != 0 || g.gl_pathc > INT32_MAX) {
        if (r == 0) globfree(&g);
        return deft_set_error(r == GLOB_NOSPACE ? DEFT_ERR_OOM : DEFT_ERR_IO, "tokens_open: %s: listing the files "
                              "failed (%s)", shown, r == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
    }
    *paths = calloc(g.gl_pathc, sizeof **paths);
    deft_status s = *paths ? DEFT_OK : deft_set_error(DEFT_ERR_OOM, "tokens_open: out of host memory");
    for (size_t i = 0; s == DEFT_OK && i < g.gl_pathc; i++) {
        (*paths)[i] = strdup(g.gl_pathv[i]);
        if (!(*paths)[i]) s = deft_set_error(DEFT_ERR_OOM, "tokens_open: out of host memory");
    }
    *n = *paths ? (int)g.gl_pathc : 0;
    globfree(&g);
    if (s == DEFT_OK) qsort(*paths, (size_t)*n, sizeof **paths, deft_path_cmp);
    return s;
}

/* A directory stands for its *.bin files, a name without glob characters for itself (so that a missing file is
 * "cannot open", not "no match"), anything else for what glob(3) finds. */
static deft_status deft_tokens_paths(const char *pattern, char ***paths, int *n) {
    struct stat st;
    if (stat(pattern, &st) == 0 && S_ISDIR(st.st_mode)) {
        char dir_pattern[DEFT_PATH_MAX];
        deft_status s = deft_path_format(dir_pattern, sizeof dir_pattern, "tokens_open", "%s/*.bin", pattern);
        return s != DEFT_OK ? s : deft_tokens_glob(dir_pattern, pattern, 1, paths, n);
    }
    if (deft_has_glob_chars(pattern)) return deft_tokens_glob(pattern, pattern, 0, paths, n);
    *paths = calloc(1, sizeof **paths);
    if (*paths) (*paths)[0] = strdup(pattern);
    if (!*paths || !(*paths)[0]) {
        free(*paths);
        *paths = NULL;
        return deft_set_error(DEFT_ERR_OOM, "tokens_open: out of host memory");
    }
    *n = 1;
    return DEFT_OK;
}

static deft_status deft_tokens_add_up(deft_tokens *t) {
    for (int i = 0; i < t->n_shards; i++) {
        t->shards[i].first = t->count;
        if (!deft_i64_add(t->count, t->shards[i].count, &t->count))
            return deft_set_error(DEFT_ERR_IO, "tokens_open: %s: the shards hold more than 2^63 tokens",
                                  t->shards[i].path);
    }
    return DEFT_OK;
}

deft_status deft_tokens_open(const char *pattern, deft_tokens **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "tokens_open: out is NULL");
    *out = NULL;
    if (!pattern) return deft_set_error(DEFT_ERR_INVALID, "tokens_open: the pattern is NULL");
    if (!pattern[0]) return deft_set_error(DEFT_ERR_IO, "tokens_open: \"\": the pattern is empty and names no file");
    char **paths = NULL;
    int n = 0;
    deft_status s = deft_tokens_paths(pattern, &paths, &n);
    deft_tokens *t = s == DEFT_OK ? calloc(1, sizeof *t) : NULL;
    if (t) t->shards = calloc((size_t)n, sizeof *t->shards);
    if (s == DEFT_OK && (!t || !t->shards)) s = deft_set_error(DEFT_ERR_OOM, "tokens_open: out of host memory");
    int taken = 0;
    for (; s == DEFT_OK && taken < n; taken++) {
        t->n_shards = taken + 1;
        s = deft_shard_open(paths[taken], &t->shards[taken]);
    }
    for (int i = taken; i < n; i++) free(paths[i]);   /* the shards own the rest */
    free(paths);
    if (s == DEFT_OK) s = deft_tokens_add_up(t);
    if (s != DEFT_OK) {
        deft_tokens_close(t);
        return s;
    }
    *out = t;
    return DEFT_OK;
}

void deft_tokens_close(deft_tokens *t) {
    if (!t) return;
    for (int i = 0; t->shards && i < t->n_shards; i++) {
        if (t->shards[i].map) munmap((void *)t->shards[i].map, t->shards[i].map_bytes);
        free(t->shards[i].path);
    }
    free(t->shards);
    free(t);
}

int64_t deft_tokens_count(const deft_tokens *t) { return t ? t->count : 0; }

int deft_tokens_shards(const deft_tokens *t) { return t ? t->n_shards : 0; }

const char *deft_tokens_shard_path(const deft_tokens *t, int shard) {
    return t && shard >= 0 && shard < t->n_shards ? t->shards[shard].path : NULL;
}

/* ---- reading ---- */

/* The shard holding token `at` (0 <= at < count): the last one starting at or before it that is not empty. */
static int deft_tokens_find(const deft_tokens *t, int64_t at) {
    int lo = 0, hi = t->n_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (t->shards[mid].first <= at) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

deft_status deft_tokens_read(const deft_tokens *t, int64_t start, int64_t n, int32_t *out) {
    if (!t) return deft_set_error(DEFT_ERR_INVALID, "tokens_read: the tokens are NULL");
    int64_t end;
    if (start < 0 || n < 0 || !deft_i64_add(start, n, &end) || end > t->count)
        return deft_set_error(DEFT_ERR_INVALID, "tokens_read: tokens [%lld, %lld + %lld) are out of the stream's "
                              "[0, %lld)", (long long)start, (long long)start, (long long)n, (long long)t->count);
    if (n > 0 && !out) return deft_set_error(DEFT_ERR_INVALID, "tokens_read: out is NULL");
    /* Empty shards on the way are passed over: their range is empty. */
    for (int i = start < end ? deft_tokens_find(t, start) : 0; start < end; i++) {
        const deft_token_shard *sh = &t->shards[i];
        const int64_t from = start - sh->first, upto = end - sh->first < sh->count ? end - sh->first : sh->count;
        const unsigned char *b = sh->map + DEFT_TOKENS_HEADER_BYTES + from * DEFT_TOKENS_TOKEN_BYTES;
        for (int64_t k = from; k < upto; k++, b += DEFT_TOKENS_TOKEN_BYTES) *out++ = (int32_t)(b[0] | b[1] << 8);
        start = sh->first + upto;
    }
    return DEFT_OK;
}

/* ---- writing ---- */

static deft_status deft_tokens_write_check(const char *path, const int32_t *tokens, int64_t n) {
    if (!path) return deft_set_error(DEFT_ERR_INVALID, "tokens_write: the path is NULL");
    if (n < 0 || n > INT32_MAX)
        return deft_set_error(DEFT_ERR_INVALID, "tokens_write: %s: %lld tokens; a shard holds 0 to %d", path,
                              (long long)n, INT32_MAX);
    if (n > 0 && !tokens) return deft_set_error(DEFT_ERR_INVALID, "tokens_write: %s: tokens is NULL", path);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > UINT16_MAX)
            return deft_set_error(DEFT_ERR_INVALID, "tokens_write: %s: token %lld is %d; a shard holds uint16 tokens "
                                  "(0 to 65535)", path, (long long)i, tokens[i]);
    return DEFT_OK;
}

static deft_status deft_tokens_put(FILE *f, const char *path, const void *p, size_t n) {
    if (fwrite(p, 1, n, f) == n) return DEFT_OK;
    return deft_set_error(DEFT_ERR_IO, "tokens_write: %s: write failed: %s; the file is incomplete", path,
                          strerror(errno));
}

static deft_status deft_tokens_write_all(FILE *f, const char *path, const int32_t *tokens, int64_t n) {
    unsigned char head[DEFT_TOKENS_HEADER_BYTES] = {0};
    const uint32_t fields[3] = {DEFT_TOKENS_MAGIC, DEFT_TOKENS_VERSION, (uint32_t)n};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) head[4 * i + k] = (unsigned char)(fields[i] >> (8 * k));
    deft_status s = deft_tokens_put(f, path, head, sizeof head);
    unsigned char chunk[DEFT_TOKENS_WRITE_CHUNK * DEFT_TOKENS_TOKEN_BYTES];
    for (int64_t at = 0; s == DEFT_OK && at < n; at += DEFT_TOKENS_WRITE_CHUNK) {
        const int64_t m = n - at < DEFT_TOKENS_WRITE_CHUNK ? n - at : DEFT_TOKENS_WRITE_CHUNK;
        for (int64_t k = 0; k < m; k++) {
            chunk[2 * k] = (unsigned char)(tokens[at + k] & 0xff);
            chunk[2 * k + 1] = (unsigned char)(tokens[at + k] >> 8);
        }
        s = deft_tokens_put(f, path, chunk, (size_t)m * DEFT_TOKENS_TOKEN_BYTES);
    }
    return s;
}

deft_status deft_tokens_write(const char *path, const int32_t *tokens, int64_t n) {
    deft_status s = deft_tokens_write_check(path, tokens, n);
    if (s != DEFT_OK) return s;
    FILE *f = fopen(path, "wb");
    if (!f) return deft_set_error(DEFT_ERR_IO, "tokens_write: %s: cannot open for writing: %s", path, strerror(errno));
    s = deft_tokens_write_all(f, path, tokens, n);
    /* fclose flushes the last buffered bytes: a full disk may only show here. */
    if (fclose(f) != 0 && s == DEFT_OK)
        s = deft_set_error(DEFT_ERR_IO, "tokens_write: %s: closing failed: %s; the file is incomplete", path,
                           strerror(errno));
    return s;
}
