/* Parameter files: every parameter of a graph, by name, with checksums over the file's header, each record's header
 * and each record's data.
 *
 * Loading reads and checks the whole file into staging buffers before it sets a single value, so a file of another
 * model, a truncated or a corrupt one leaves the graph as it was. Staging buffers are sized from the graph's own
 * parameters once a record has matched one, never from lengths read from the file.
 *
 * A header's CRC is checked before any of its fields is compared with the graph: only then can a name, dtype or
 * shape that differs from the graph's mean "the file is of another model" (DEFT_ERR_INVALID) rather than a flipped
 * bit (DEFT_ERR_IO). Version 1 files, whose headers carry no CRC, still load; their data is checked as before. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "byte_order.h"
#include "graph_internal.h"

#define DEFT_PARAMS_MAGIC "DEFTPARM"
#define DEFT_PARAMS_MAGIC_LEN 8
#define DEFT_PARAMS_VERSION 2u
/* The first version whose file and record headers carry a CRC. */
#define DEFT_PARAMS_HEAD_CRC_VERSION 2u
#define DEFT_PARAMS_FILE_HEAD (DEFT_PARAMS_MAGIC_LEN + 8)
/* A record's name can only match a graph name (at most 63 bytes); anything far longer is corruption. */
#define DEFT_PARAMS_MAX_NAME 4096
/* The longest piece of a name quoted in a message. */
#define DEFT_PARAMS_QUOTE 200

/* ---- CRC-32 (IEEE 802.3, the polynomial of zlib and PNG) ---- */

/* The table is built per call (2 KiB of work) so that no shared state needs a once-only initialisation. */
static uint32_t deft_crc32(const void *data, size_t n) {
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    const unsigned char *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* ---- byte order: the file is little-endian whatever the host ---- */

/* Returns n, so that a caller can advance its position by it. */
static size_t deft_put_le(unsigned char *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    return (size_t)n;
}

static uint64_t deft_get_le(const unsigned char *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}


/* ---- the graph's parameters ---- */

/* Records are matched by name, so a name must be present and unique. */
static deft_status deft_check_names(deft_tensor *const *params, int n, const char *what, const char *path) {
    for (int i = 0; i < n; i++) {
        if (params[i]->name[0] == '\0')
            return deft_set_error(DEFT_ERR_INVALID, "%s: %s: parameter node %d has an empty name; a parameter file "
                                  "finds parameters by name", what, path, params[i]->id);
        for (int j = i + 1; j < n; j++)
            if (strcmp(params[i]->name, params[j]->name) == 0)
                return deft_set_error(DEFT_ERR_INVALID,
                                      "%s: %s: two parameters are named '%s' (nodes %d and %d); a parameter file "
                                      "finds parameters by name, so names must be unique",
                                      what, path, params[i]->name, params[i]->id, params[j]->id);
    }
    return DEFT_OK;
}

/* The graph's parameters in build order (the order a file is written in), checked to have unique names. */
static deft_status deft_collect_params(const deft_graph *g, const char *what, const char *path,
                                       deft_tensor ***out, int *n_out) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i]->op == DEFT_OP_PARAM;
    deft_tensor **params = malloc((size_t)(n ? n : 1) * sizeof *params);
    if (!params) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", what);
    n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == DEFT_OP_PARAM) params[n++] = g->nodes[i];
    deft_status s = deft_check_names(params, n, what, path);
    if (s != DEFT_OK) {
        free(params);
        return s;
    }
    *out = params;
    *n_out = n;
    return DEFT_OK;
}

/* ---- saving ---- */

static deft_status deft_write(FILE *f, const char *path, const void *p, size_t n) {
    if (n == 0 || fwrite(p, 1, n, f) == n) return DEFT_OK;
    return deft_set_error(DEFT_ERR_IO, "params_save: %s: write failed: %s; the file is incomplete", path,
                          strerror(errno));
}

/* Everything of a record before its data, in one buffer (name <= 63 bytes, so it always fits). */
static size_t deft_record_head(const deft_tensor *t, size_t bytes, unsigned char *b) {
    size_t name_len = strlen(t->name), at = 0;
    at += deft_put_le(b + at, name_len, 4);
    memcpy(b + at, t->name, name_len);
    at += name_len;
    at += deft_put_le(b + at, (uint64_t)t->dtype, 4);
    at += deft_put_le(b + at, (uint64_t)t->ndim, 4);
    for (int d = 0; d < t->ndim; d++) at += deft_put_le(b + at, (uint64_t)t->shape[d], 8);
    at += deft_put_le(b + at, bytes, 8);
    return at;
}

static deft_status deft_write_record(FILE *f, const char *path, const deft_tensor *t) {
    size_t bytes = deft_tensor_bytes(t);
    unsigned char *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "params_save: out of host memory for parameter '%s'", t->name);
    deft_status s = deft_param_get(t, data, bytes);
    if (s != DEFT_OK) s = deft_set_error(s, "params_save: %s: reading parameter '%s': %s", path, t->name,
                                         deft_errmsg());
    unsigned char head[4 + sizeof t->name + 4 + 4 + 8 * DEFT_MAX_DIMS + 8 + 4], crc[4];
    if (s == DEFT_OK) {
        deft_elements_to_order(data, bytes, deft_dtype_size(t->dtype), true);
        deft_put_le(crc, deft_crc32(data, bytes), 4);
        size_t at = deft_record_head(t, bytes, head);
        at += deft_put_le(head + at, deft_crc32(head, at), 4);
        s = deft_write(f, path, head, at);
    }
    if (s == DEFT_OK) s = deft_write(f, path, data, bytes);
    if (s == DEFT_OK) s = deft_write(f, path, crc, sizeof crc);
    free(data);
    return s;
}

static deft_status deft_write_params(FILE *f, const char *path, deft_tensor *const *params, int n) {
    unsigned char head[DEFT_PARAMS_FILE_HEAD + 4];
    memcpy(head, DEFT_PARAMS_MAGIC, DEFT_PARAMS_MAGIC_LEN);
    deft_put_le(head + 8, DEFT_PARAMS_VERSION, 4);
    deft_put_le(head + 12, (uint64_t)n, 4);
    deft_put_le(head + DEFT_PARAMS_FILE_HEAD, deft_crc32(head, DEFT_PARAMS_FILE_HEAD), 4);
    deft_status s = deft_write(f, path, head, sizeof head);
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_write_record(f, path, params[i]);
    return s;
}

/* Writes in place rather than through a temporary file and a rename, so that any path that can be opened (a pipe,
 * a device) works; an interrupted save leaves a file that loading rejects as truncated. */
deft_status deft_params_save(const deft_graph *g, const char *path) {
    if (!g || !path) return deft_set_error(DEFT_ERR_INVALID, "params_save: the graph and the path must not be NULL");
    deft_tensor **params;
    int n;
    deft_status s = deft_collect_params(g, "params_save", path, &params, &n);
    if (s != DEFT_OK) return s;
    FILE *f = fopen(path, "wb");
    if (!f) {
        s = deft_set_error(DEFT_ERR_IO, "params_save: %s: cannot open for writing: %s", path, strerror(errno));
        free(params);
        return s;
    }
    s = deft_write_params(f, path, params, n);
    /* fclose flushes the last buffered bytes: a full disk may only show here. */
    if (fclose(f) != 0 && s == DEFT_OK)
        s = deft_set_error(DEFT_ERR_IO, "params_save: %s: closing failed: %s; the file is incomplete", path,
                           strerror(errno));
    free(params);
    return s;
}

/* ---- loading ---- */

typedef struct deft_param_reader {
    FILE *f;
    const char *path;
    uint64_t offset;              /* bytes read so far, for messages */
    uint64_t version;             /* the file's format version */
} deft_param_reader;

/* A record's header as read, its fields not yet checked against the graph. */
typedef struct deft_head_read {
    unsigned char raw[4 + DEFT_PARAMS_MAX_NAME + 8 + 8 * DEFT_MAX_DIMS + 8];   /* the bytes the CRC covers */
    size_t raw_len;
    char name[DEFT_PARAMS_MAX_NAME + 1];
    size_t name_len;
    uint64_t dtype, ndim, bytes;
    int64_t dims[DEFT_MAX_DIMS];
} deft_head_read;

/* Reads exactly n bytes; running out is "truncated", saying in what. */
static deft_status deft_read(deft_param_reader *r, void *p, size_t n, const char *what) {
    size_t got = n ? fread(p, 1, n, r->f) : 0;
    r->offset += got;
    if (got == n) return DEFT_OK;
    if (ferror(r->f))
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: read error in %s: %s", r->path, what, strerror(errno));
    return deft_set_error(DEFT_ERR_IO, "params_load: %s: truncated: the file ends in %s, after %llu bytes", r->path,
                          what, (unsigned long long)r->offset);
}

static deft_status deft_read_le(deft_param_reader *r, int n, uint64_t *v, const char *what) {
    unsigned char b[8];
    deft_status s = deft_read(r, b, (size_t)n, what);
    if (s == DEFT_OK) *v = deft_get_le(b, n);
    return s;
}

/* Reads a stored CRC-32 and compares it with the one of the bytes it covers. */
static deft_status deft_check_crc(deft_param_reader *r, const void *p, size_t n, const char *what, const char *in) {
    uint64_t stored = 0;
    deft_status s = deft_read_le(r, 4, &stored, what);
    if (s != DEFT_OK) return s;
    const uint32_t computed = deft_crc32(p, n);
    if (stored != computed)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: checksum mismatch in %s (the file says 0x%08llx, the "
                              "bytes give 0x%08x); the file is corrupt", r->path, in, (unsigned long long)stored,
                              (unsigned)computed);
    return DEFT_OK;
}

static deft_status deft_read_file_head(deft_param_reader *r, uint64_t *count) {
    unsigned char head[DEFT_PARAMS_FILE_HEAD];
    deft_status s = deft_read(r, head, DEFT_PARAMS_MAGIC_LEN, "the header");
    if (s != DEFT_OK) return s;
    if (memcmp(head, DEFT_PARAMS_MAGIC, DEFT_PARAMS_MAGIC_LEN) != 0)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: bad magic: not a deft parameter file (it does not start "
                              "with \"DEFTPARM\")", r->path);
    s = deft_read(r, head + DEFT_PARAMS_MAGIC_LEN, 4, "the header");
    r->version = s == DEFT_OK ? deft_get_le(head + DEFT_PARAMS_MAGIC_LEN, 4) : 0;
    if (s == DEFT_OK && (r->version < 1 || r->version > DEFT_PARAMS_VERSION))
        s = deft_set_error(DEFT_ERR_IO, "params_load: %s: format version %llu; this build reads versions 1 and %u",
                           r->path, (unsigned long long)r->version, DEFT_PARAMS_VERSION);
    if (s == DEFT_OK) s = deft_read(r, head + DEFT_PARAMS_MAGIC_LEN + 4, 4, "the header");
    if (s == DEFT_OK && r->version >= DEFT_PARAMS_HEAD_CRC_VERSION)
        s = deft_check_crc(r, head, sizeof head, "the header", "the file's header");
    if (s == DEFT_OK) *count = deft_get_le(head + DEFT_PARAMS_MAGIC_LEN + 4, 4);
    return s;
}

/* Appends n bytes of the record's header to h->raw and returns them. */
static deft_status deft_read_head_part(deft_param_reader *r, deft_head_read *h, size_t n, const char *what,
                                       const unsigned char **part) {
    *part = h->raw + h->raw_len;
    deft_status s = deft_read(r, h->raw + h->raw_len, n, what);
    h->raw_len += n;
    return s;
}

/* Reads the name length and the name. Lengths that could not fit the header's buffer are corruption. */
static deft_status deft_read_head_name(deft_param_reader *r, uint64_t record, deft_head_read *h) {
    char what[64];
    snprintf(what, sizeof what, "the name of record %llu", (unsigned long long)record);
    const unsigned char *b;
    deft_status s = deft_read_head_part(r, h, 4, what, &b);
    if (s != DEFT_OK) return s;
    uint64_t len = deft_get_le(b, 4);
    if (len == 0 || len > DEFT_PARAMS_MAX_NAME)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: record %llu has a name of %llu bytes; the file is corrupt",
                              r->path, (unsigned long long)record, (unsigned long long)len);
    s = deft_read_head_part(r, h, (size_t)len, what, &b);
    if (s != DEFT_OK) return s;
    memcpy(h->name, b, (size_t)len);
    h->name[len] = '\0';
    h->name_len = (size_t)len;
    return DEFT_OK;
}

/* Reads the rest of the header (dtype, ndim, dims, data bytes) and, from version 2, checks its CRC. */
static deft_status deft_read_head_rest(deft_param_reader *r, uint64_t record, deft_head_read *h) {
    char what[64];
    snprintf(what, sizeof what, "the header of record %llu", (unsigned long long)record);
    const unsigned char *b;
    deft_status s = deft_read_head_part(r, h, 8, what, &b);
    if (s != DEFT_OK) return s;
    h->dtype = deft_get_le(b, 4);
    h->ndim = deft_get_le(b + 4, 4);
    if (h->ndim > DEFT_MAX_DIMS)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: record %llu has %llu dimensions; the file is corrupt",
                              r->path, (unsigned long long)record, (unsigned long long)h->ndim);
    s = deft_read_head_part(r, h, 8 * (size_t)h->ndim + 8, what, &b);
    if (s != DEFT_OK) return s;
    for (uint64_t d = 0; d < h->ndim; d++) h->dims[d] = (int64_t)deft_get_le(b + 8 * d, 8);
    h->bytes = deft_get_le(b + 8 * h->ndim, 8);
    if (r->version < DEFT_PARAMS_HEAD_CRC_VERSION) return DEFT_OK;
    return deft_check_crc(r, h->raw, h->raw_len, what, what);
}

/* The index of the graph's parameter named exactly name[0, len) (a name with a NUL byte matches none), or -1. */
static int deft_param_index(deft_tensor *const *params, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(params[i]->name) == len && memcmp(params[i]->name, name, len) == 0) return i;
    return -1;
}

/* Finds the record's parameter by name (*index: its position in `params`). */
static deft_status deft_match_name(const deft_param_reader *r, uint64_t record, const deft_head_read *h,
                                   deft_tensor *const *params, int n, void *const *staged, int *index) {
    *index = deft_param_index(params, n, h->name, h->name_len);
    if (*index < 0)
        return deft_set_error(DEFT_ERR_INVALID, "params_load: %s: the graph has no parameter '%.*s' (record %llu); the "
                              "file is of another model", r->path, DEFT_PARAMS_QUOTE, h->name,
                              (unsigned long long)record);
    if (staged[*index])
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: parameter '%s' appears twice; the file is corrupt",
                              r->path, params[*index]->name);
    return DEFT_OK;
}

/* Checks the record's dtype, shape and data length against the graph's parameter t. */
static deft_status deft_match_type(const deft_param_reader *r, const deft_head_read *h, const deft_tensor *t) {
    if (h->dtype >= DEFT_DTYPE_COUNT)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: parameter '%s' has dtype code %llu and %llu dimensions; "
                              "the file is corrupt", r->path, t->name, (unsigned long long)h->dtype,
                              (unsigned long long)h->ndim);
    if ((deft_dtype)h->dtype != t->dtype)
        return deft_set_error(DEFT_ERR_INVALID, "params_load: %s: parameter '%s' is %s in the file but %s in the graph",
                              r->path, t->name, deft_dtype_name((deft_dtype)h->dtype), deft_dtype_name(t->dtype));
    if ((int)h->ndim != t->ndim || memcmp(h->dims, t->shape, (size_t)h->ndim * sizeof h->dims[0]) != 0) {
        char in_file[256], in_graph[256];
        return deft_set_error(DEFT_ERR_INVALID, "params_load: %s: parameter '%s' is %s in the file but %s in the graph",
                              r->path, t->name, deft_shape_str((int)h->ndim, h->dims, in_file, sizeof in_file),
                              deft_shape_str(t->ndim, t->shape, in_graph, sizeof in_graph));
    }
    size_t bytes = deft_tensor_bytes(t);
    if (h->bytes != bytes)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: parameter '%s' has %llu bytes of data, its dtype and shape "
                              "need %zu; the file is corrupt", r->path, t->name, (unsigned long long)h->bytes, bytes);
    return DEFT_OK;
}

/* Reads the data and its checksum into a new host-order buffer. */
static deft_status deft_read_record_data(deft_param_reader *r, const deft_tensor *t, void **out) {
    char what[128];
    snprintf(what, sizeof what, "the data of parameter '%s'", t->name);
    size_t bytes = deft_tensor_bytes(t);
    uint64_t crc = 0;
    unsigned char *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "params_load: out of host memory for parameter '%s'", t->name);
    deft_status s = deft_read(r, data, bytes, what);
    if (s == DEFT_OK) {
        snprintf(what, sizeof what, "the checksum of parameter '%s'", t->name);
        s = deft_read_le(r, 4, &crc, what);
    }
    if (s == DEFT_OK && crc != deft_crc32(data, bytes))
        s = deft_set_error(DEFT_ERR_IO, "params_load: %s: checksum mismatch in parameter '%s' (the file says 0x%08llx, "
                           "the data gives 0x%08x); the file is corrupt", r->path, t->name, (unsigned long long)crc,
                           (unsigned)deft_crc32(data, bytes));
    if (s != DEFT_OK) {
        free(data);
        return s;
    }
    deft_elements_to_order(data, bytes, deft_dtype_size(t->dtype), true);
    *out = data;
    return DEFT_OK;
}

/* The whole header (and its CRC) comes first: its fields are compared with the graph only once it is known intact. */
static deft_status deft_read_record(deft_param_reader *r, uint64_t record, deft_tensor *const *params, int n,
                                    void **staged) {
    deft_head_read *h = malloc(sizeof *h);
    if (!h) return deft_set_error(DEFT_ERR_OOM, "params_load: out of host memory");
    h->raw_len = 0;
    int index = -1;
    deft_status s = deft_read_head_name(r, record, h);
    if (s == DEFT_OK) s = deft_read_head_rest(r, record, h);
    if (s == DEFT_OK) s = deft_match_name(r, record, h, params, n, staged, &index);
    if (s == DEFT_OK) s = deft_match_type(r, h, params[index]);
    free(h);
    if (s == DEFT_OK) s = deft_read_record_data(r, params[index], &staged[index]);
    return s;
}

/* Every record, then the end of the file, then every parameter accounted for. */
static deft_status deft_read_params(deft_param_reader *r, deft_tensor *const *params, int n, void **staged) {
    uint64_t count = 0;
    deft_status s = deft_read_file_head(r, &count);
    for (uint64_t i = 0; i < count && s == DEFT_OK; i++) s = deft_read_record(r, i, params, n, staged);
    if (s != DEFT_OK) return s;
    if (fgetc(r->f) != EOF)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: trailing bytes after the last of its %llu records; the "
                              "file is corrupt", r->path, (unsigned long long)count);
    for (int i = 0; i < n; i++) {
        if (staged[i]) continue;
        char shape[256];
        return deft_set_error(DEFT_ERR_INVALID, "params_load: %s: the file has no parameter '%s' (%s %s); it is of "
                              "another model", r->path, params[i]->name, deft_dtype_name(params[i]->dtype),
                              deft_shape_str(params[i]->ndim, params[i]->shape, shape, sizeof shape));
    }
    return DEFT_OK;
}

static deft_status deft_apply_params(const char *path, deft_tensor *const *params, int n, void *const *staged) {
    for (int i = 0; i < n; i++) {
        deft_status s = deft_param_set(params[i], staged[i], deft_tensor_bytes(params[i]));
        if (s != DEFT_OK)
            return deft_set_error(s, "params_load: %s: setting parameter '%s': %s", path, params[i]->name,
                                  deft_errmsg());
    }
    return DEFT_OK;
}

deft_status deft_params_load(deft_graph *g, const char *path) {
    if (!g || !path) return deft_set_error(DEFT_ERR_INVALID, "params_load: the graph and the path must not be NULL");
    deft_tensor **params;
    int n;
    deft_status s = deft_collect_params(g, "params_load", path, &params, &n);
    if (s != DEFT_OK) return s;
    void **staged = calloc((size_t)(n ? n : 1), sizeof *staged);
    deft_param_reader r = {fopen(path, "rb"), path, 0, 0};
    if (!staged) s = deft_set_error(DEFT_ERR_OOM, "params_load: out of host memory");
    else if (!r.f) s = deft_set_error(DEFT_ERR_IO, "params_load: %s: cannot open: %s", path, strerror(errno));
    else s = deft_read_params(&r, params, n, staged);
    if (r.f) fclose(r.f);
    if (s == DEFT_OK) s = deft_apply_params(path, params, n, staged);
    for (int i = 0; staged && i < n; i++) free(staged[i]);
    free(staged);
    free(params);
    return s;
}
