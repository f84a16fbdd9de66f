/* Parameter records (param_records.h): written from the graph's parameters, read and checked against them.
 *
 * Reading stages every record before a single value is set, so a file of another model, a truncated or a corrupt one
 * leaves the graph as it was. Staging buffers are sized from the graph's own parameters once a record has matched
 * one, never from lengths read from the file.
 *
 * A header's CRC is checked before any of its fields is compared with the graph: only then can a name, dtype or
 * shape that differs from the graph's mean "the file is of another model" (DEFT_ERR_INVALID) rather than a flipped
 * bit (DEFT_ERR_IO). */
#include <stdlib.h>
#include <string.h>

#include "byte_order.h"
#include "param_records.h"

/* A record's name can only match a graph name (at most 63 bytes); anything far longer is corruption. */
#define DEFT_PARAMS_MAX_NAME 4096
/* The longest piece of a name quoted in a message. */
#define DEFT_PARAMS_QUOTE 200

/* ---- the graph's parameters ---- */

static deft_status deft_check_names(deft_tensor *const *params, int n, const char *who, const char *path) {
    for (int i = 0; i < n; i++) {
        if (params[i]->name[0] == '\0')
            return deft_set_error(DEFT_ERR_INVALID, "%s: %s: parameter node %d has an empty name; a parameter file "
                                  "finds parameters by name", who, path, params[i]->id);
        for (int j = i + 1; j < n; j++)
            if (strcmp(params[i]->name, params[j]->name) == 0)
                return deft_set_error(DEFT_ERR_INVALID,
                                      "%s: %s: two parameters are named '%s' (nodes %d and %d); a parameter file "
                                      "finds parameters by name, so names must be unique",
                                      who, path, params[i]->name, params[i]->id, params[j]->id);
    }
    return DEFT_OK;
}

deft_status deft_params_collect(const deft_graph *g, const char *who, const char *path, deft_tensor ***out,
                                int *n_out) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i]->op == DEFT_OP_PARAM;
    deft_tensor **params = malloc((size_t)(n ? n : 1) * sizeof *params);
    if (!params) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", who);
    n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == DEFT_OP_PARAM) params[n++] = g->nodes[i];
    deft_status s = deft_check_names(params, n, who, path);
    if (s != DEFT_OK) {
        free(params);
        return s;
    }
    *out = params;
    *n_out = n;
    return DEFT_OK;
}

/* ---- writing ---- */

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

static deft_status deft_write_record(deft_file_writer *w, const deft_tensor *t) {
    size_t bytes = deft_tensor_bytes(t);
    unsigned char *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory for parameter '%s'", w->who, t->name);
    deft_status s = deft_param_get(t, data, bytes);
    if (s != DEFT_OK) s = deft_set_error(s, "%s: %s: reading parameter '%s': %s", w->who, w->path, t->name,
                                         deft_errmsg());
    unsigned char head[4 + sizeof t->name + 4 + 4 + 8 * DEFT_MAX_DIMS + 8 + 4], crc[4];
    if (s == DEFT_OK) {
        deft_elements_to_order(data, bytes, deft_dtype_size(t->dtype), true);
        deft_put_le(crc, deft_crc32(data, bytes), 4);
        size_t at = deft_record_head(t, bytes, head);
        at += deft_put_le(head + at, deft_crc32(head, at), 4);
        s = deft_file_write(w, head, at);
    }
    if (s == DEFT_OK) s = deft_file_write(w, data, bytes);
    if (s == DEFT_OK) s = deft_file_write(w, crc, sizeof crc);
    free(data);
    return s;
}

deft_status deft_param_records_write(deft_file_writer *w, deft_tensor *const *params, int n) {
    deft_status s = DEFT_OK;
    for (int i = 0; i < n && s == DEFT_OK; i++) s = deft_write_record(w, params[i]);
    return s;
}

/* ---- reading ---- */

/* A record's header as read, its fields not yet checked against the graph. */
typedef struct deft_head_read {
    unsigned char raw[4 + DEFT_PARAMS_MAX_NAME + 8 + 8 * DEFT_MAX_DIMS + 8];   /* the bytes the CRC covers */
    size_t raw_len;
    char name[DEFT_PARAMS_MAX_NAME + 1];
    size_t name_len;
    uint64_t dtype, ndim, bytes;
    int64_t dims[DEFT_MAX_DIMS];
} deft_head_read;

/* Appends n bytes of the record's header to h->raw and returns them. */
static deft_status deft_read_head_part(deft_file_reader *r, deft_head_read *h, size_t n, const char *what,
                                       const unsigned char **part) {
    *part = h->raw + h->raw_len;
    deft_status s = deft_file_read(r, h->raw + h->raw_len, n, what);
    h->raw_len += n;
    return s;
}

/* Reads the name length and the name. Lengths that could not fit the header's buffer are corruption. */
static deft_status deft_read_head_name(deft_file_reader *r, uint64_t record, deft_head_read *h) {
    char what[64];
    snprintf(what, sizeof what, "the name of record %llu", (unsigned long long)record);
    const unsigned char *b;
    deft_status s = deft_read_head_part(r, h, 4, what, &b);
    if (s != DEFT_OK) return s;
    uint64_t len = deft_get_le(b, 4);
    if (len == 0 || len > DEFT_PARAMS_MAX_NAME)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: record %llu has a name of %llu bytes; the file is corrupt", r->who,
                              r->path, (unsigned long long)record, (unsigned long long)len);
    s = deft_read_head_part(r, h, (size_t)len, what, &b);
    if (s != DEFT_OK) return s;
    memcpy(h->name, b, (size_t)len);
    h->name[len] = '\0';
    h->name_len = (size_t)len;
    return DEFT_OK;
}

/* Reads the rest of the header (dtype, ndim, dims, data bytes) and, when it has one, checks its CRC. */
static deft_status deft_read_head_rest(deft_file_reader *r, uint64_t record, bool head_crc, deft_head_read *h) {
    char what[64];
    snprintf(what, sizeof what, "the header of record %llu", (unsigned long long)record);
    const unsigned char *b;
    deft_status s = deft_read_head_part(r, h, 8, what, &b);
    if (s != DEFT_OK) return s;
    h->dtype = deft_get_le(b, 4);
    h->ndim = deft_get_le(b + 4, 4);
    if (h->ndim > DEFT_MAX_DIMS)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: record %llu has %llu dimensions; the file is corrupt", r->who,
                              r->path, (unsigned long long)record, (unsigned long long)h->ndim);
    s = deft_read_head_part(r, h, 8 * (size_t)h->ndim + 8, what, &b);
    if (s != DEFT_OK) return s;
    for (uint64_t d = 0; d < h->ndim; d++) h->dims[d] = (int64_t)deft_get_le(b + 8 * d, 8);
    h->bytes = deft_get_le(b + 8 * h->ndim, 8);
    if (!head_crc) return DEFT_OK;
    return deft_file_check_crc(r, h->raw, h->raw_len, what, what);
}

/* The index of the graph's parameter named exactly name[0, len) (a name with a NUL byte matches none), or -1. */
static int deft_param_index(deft_tensor *const *params, int n, const char *name, size_t len) {
    for (int i = 0; i < n; i++)
        if (strlen(params[i]->name) == len && memcmp(params[i]->name, name, len) == 0) return i;
    return -1;
}

/* Finds the record's parameter by name (*index: its position in `params`). */
static deft_status deft_match_name(const deft_file_reader *r, uint64_t record, const deft_head_read *h,
                                   deft_tensor *const *params, int n, void *const *staged, int *index) {
    *index = deft_param_index(params, n, h->name, h->name_len);
    if (*index < 0)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the graph has no parameter '%.*s' (record %llu); the file is "
                              "of another model", r->who, r->path, DEFT_PARAMS_QUOTE, h->name,
                              (unsigned long long)record);
    if (staged[*index])
        return deft_set_error(DEFT_ERR_IO, "%s: %s: parameter '%s' appears twice; the file is corrupt", r->who,
                              r->path, params[*index]->name);
    return DEFT_OK;
}

/* Checks the record's dtype, shape and data length against the graph's parameter t. */
static deft_status deft_match_type(const deft_file_reader *r, const deft_head_read *h, const deft_tensor *t) {
    if (h->dtype >= DEFT_DTYPE_COUNT)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: parameter '%s' has dtype code %llu and %llu dimensions; the file "
                              "is corrupt", r->who, r->path, t->name, (unsigned long long)h->dtype,
                              (unsigned long long)h->ndim);
    if ((deft_dtype)h->dtype != t->dtype)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: parameter '%s' is %s in the file but %s in the graph", r->who,
                              r->path, t->name, deft_dtype_name((deft_dtype)h->dtype), deft_dtype_name(t->dtype));
    if ((int)h->ndim != t->ndim || memcmp(h->dims, t->shape, (size_t)h->ndim * sizeof h->dims[0]) != 0) {
        char in_file[256], in_graph[256];
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: parameter '%s' is %s in the file but %s in the graph", r->who,
                              r->path, t->name, deft_shape_str((int)h->ndim, h->dims, in_file, sizeof in_file),
                              deft_shape_str(t->ndim, t->shape, in_graph, sizeof in_graph));
    }
    size_t bytes = deft_tensor_bytes(t);
    if (h->bytes != bytes)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: parameter '%s' has %llu bytes of data, its dtype and shape need "
                              "%zu; the file is corrupt", r->who, r->path, t->name, (unsigned long long)h->bytes,
                              bytes);
    return DEFT_OK;
}

/* Reads the data and its checksum into a new host-order buffer. */
static deft_status deft_read_record_data(deft_file_reader *r, const deft_tensor *t, void **out) {
    char what[128], in[128];
    snprintf(what, sizeof what, "the data of parameter '%s'", t->name);
    size_t bytes = deft_tensor_bytes(t);
    unsigned char *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory for parameter '%s'", r->who, t->name);
    deft_status s = deft_file_read(r, data, bytes, what);
    if (s == DEFT_OK) {
        snprintf(what, sizeof what, "the checksum of parameter '%s'", t->name);
        snprintf(in, sizeof in, "parameter '%s'", t->name);
        s = deft_file_check_crc(r, data, bytes, what, in);
    }
    if (s != DEFT_OK) {
        free(data);
        return s;
    }
    deft_elements_to_order(data, bytes, deft_dtype_size(t->dtype), true);
    *out = data;
    return DEFT_OK;
}

/* The whole header (and its CRC) comes first: its fields are compared with the graph only once it is known intact. */
static deft_status deft_read_record(deft_file_reader *r, uint64_t record, bool head_crc, deft_tensor *const *params,
                                    int n, void **staged) {
    deft_head_read *h = malloc(sizeof *h);
    if (!h) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", r->who);
    h->raw_len = 0;
    int index = -1;
    deft_status s = deft_read_head_name(r, record, h);
    if (s == DEFT_OK) s = deft_read_head_rest(r, record, head_crc, h);
    if (s == DEFT_OK) s = deft_match_name(r, record, h, params, n, staged, &index);
    if (s == DEFT_OK) s = deft_match_type(r, h, params[index]);
    free(h);
    if (s == DEFT_OK) s = deft_read_record_data(r, params[index], &staged[index]);
    return s;
}

deft_status deft_param_records_read(deft_file_reader *r, uint64_t count, bool head_crc, deft_tensor *const *params,
                                    int n, void **staged) {
    deft_status s = DEFT_OK;
    for (uint64_t i = 0; i < count && s == DEFT_OK; i++) s = deft_read_record(r, i, head_crc, params, n, staged);
    return s;
}

deft_status deft_param_records_complete(const deft_file_reader *r, deft_tensor *const *params, int n,
                                        void *const *staged) {
    for (int i = 0; i < n; i++) {
        if (staged[i]) continue;
        char shape[256];
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the file has no parameter '%s' (%s %s); it is of another "
                              "model", r->who, r->path, params[i]->name, deft_dtype_name(params[i]->dtype),
                              deft_shape_str(params[i]->ndim, params[i]->shape, shape, sizeof shape));
    }
    return DEFT_OK;
}

deft_status deft_param_records_apply(const char *who, const char *path, deft_tensor *const *params, int n,
                                     void *const *staged) {
    for (int i = 0; i < n; i++) {
        deft_status s = deft_param_set(params[i], staged[i], deft_tensor_bytes(params[i]));
        if (s != DEFT_OK)
            return deft_set_error(s, "%s: %s: setting parameter '%s': %s", who, path, params[i]->name, deft_errmsg());
    }
    return DEFT_OK;
}
