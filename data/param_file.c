/* Parameter files: every parameter of a graph, by name, with checksums over the file's header, each record's header
 * and each record's data (the records: data/param_records.c).
 *
 * Loading reads and checks the whole file into staging buffers before it sets a single value, so a file of another
 * model, a truncated or a corrupt one leaves the graph as it was. Version 1 files, whose headers carry no CRC, still
 * load; their data is checked as before. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "param_records.h"

#define DEFT_PARAMS_MAGIC "DEFTPARM"
#define DEFT_PARAMS_MAGIC_LEN 8
#define DEFT_PARAMS_VERSION 2u
/* The first version whose file and record headers carry a CRC. */
#define DEFT_PARAMS_HEAD_CRC_VERSION 2u
#define DEFT_PARAMS_FILE_HEAD (DEFT_PARAMS_MAGIC_LEN + 8)

/* ---- saving ---- */

static deft_status deft_write_params(deft_file_writer *w, deft_tensor *const *params, int n) {
    unsigned char head[DEFT_PARAMS_FILE_HEAD + 4];
    memcpy(head, DEFT_PARAMS_MAGIC, DEFT_PARAMS_MAGIC_LEN);
    deft_put_le(head + 8, DEFT_PARAMS_VERSION, 4);
    deft_put_le(head + 12, (uint64_t)n, 4);
    deft_put_le(head + DEFT_PARAMS_FILE_HEAD, deft_crc32(head, DEFT_PARAMS_FILE_HEAD), 4);
    deft_status s = deft_file_write(w, head, sizeof head);
    return s == DEFT_OK ? deft_param_records_write(w, params, n) : s;
}

/* Writes in place rather than through a temporary file and a rename, so that any path that can be opened (a pipe,
 * a device) works; an interrupted save leaves a file that loading rejects as truncated. */
deft_status deft_params_save(const deft_graph *g, const char *path) {
    if (!g || !path) return deft_set_error(DEFT_ERR_INVALID, "params_save: the graph and the path must not be NULL");
    deft_tensor **params;
    int n;
    deft_status s = deft_params_collect(g, "params_save", path, &params, &n);
    if (s != DEFT_OK) return s;
    FILE *f = fopen(path, "wb");
    if (!f) {
        s = deft_set_error(DEFT_ERR_IO, "params_save: %s: cannot open for writing: %s", path, strerror(errno));
        free(params);
        return s;
    }
    deft_file_writer w = {f, "params_save", path, "the file is incomplete"};
    s = deft_write_params(&w, params, n);
    /* fclose flushes the last buffered bytes: a full disk may only show here. */
    if (fclose(f) != 0 && s == DEFT_OK)
        s = deft_set_error(DEFT_ERR_IO, "params_save: %s: closing failed: %s; the file is incomplete", path,
                           strerror(errno));
    free(params);
    return s;
}

/* ---- loading ---- */

static deft_status deft_read_file_head(deft_file_reader *r, uint64_t *version, uint64_t *count) {
    unsigned char head[DEFT_PARAMS_FILE_HEAD];
    deft_status s = deft_file_read(r, head, DEFT_PARAMS_MAGIC_LEN, "the header");
    if (s != DEFT_OK) return s;
    if (memcmp(head, DEFT_PARAMS_MAGIC, DEFT_PARAMS_MAGIC_LEN) != 0)
        return deft_set_error(DEFT_ERR_IO, "params_load: %s: bad magic: not a deft parameter file (it does not start "
                              "with \"DEFTPARM\")", r->path);
    s = deft_file_read(r, head + DEFT_PARAMS_MAGIC_LEN, 4, "the header");
    *version = s == DEFT_OK ? deft_get_le(head + DEFT_PARAMS_MAGIC_LEN, 4) : 0;
    if (s == DEFT_OK && (*version < 1 || *version > DEFT_PARAMS_VERSION))
        s = deft_set_error(DEFT_ERR_IO, "params_load: %s: format version %llu; this build reads versions 1 and %u",
                           r->path, (unsigned long long)*version, DEFT_PARAMS_VERSION);
    if (s == DEFT_OK) s = deft_file_read(r, head + DEFT_PARAMS_MAGIC_LEN + 4, 4, "the header");
    if (s == DEFT_OK && *version >= DEFT_PARAMS_HEAD_CRC_VERSION)
        s = deft_file_check_crc(r, head, sizeof head, "the header", "the file's header");
    if (s == DEFT_OK) *count = deft_get_le(head + DEFT_PARAMS_MAGIC_LEN + 4, 4);
    return s;
}

/* Every record, then the end of the file, then every parameter accounted for. */
static deft_status deft_read_params(deft_file_reader *r, deft_tensor *const *params, int n, void **staged) {
    uint64_t version = 0, count = 0;
    deft_status s = deft_read_file_head(r, &version, &count);
    if (s == DEFT_OK)
        s = deft_param_records_read(r, count, version >= DEFT_PARAMS_HEAD_CRC_VERSION, params, n, staged);
    if (s != DEFT_OK) return s;
    char after[64];
    snprintf(after, sizeof after, "the last of its %llu records", (unsigned long long)count);
    s = deft_file_expect_end(r, after);
    return s == DEFT_OK ? deft_param_records_complete(r, params, n, staged) : s;
}

deft_status deft_params_load(deft_graph *g, const char *path) {
    if (!g || !path) return deft_set_error(DEFT_ERR_INVALID, "params_load: the graph and the path must not be NULL");
    deft_tensor **params;
    int n;
    deft_status s = deft_params_collect(g, "params_load", path, &params, &n);
    if (s != DEFT_OK) return s;
    void **staged = calloc((size_t)(n ? n : 1), sizeof *staged);
    deft_file_reader r = {fopen(path, "rb"), "params_load", path, 0};
    if (!staged) s = deft_set_error(DEFT_ERR_OOM, "params_load: out of host memory");
    else if (!r.f) s = deft_set_error(DEFT_ERR_IO, "params_load: %s: cannot open: %s", path, strerror(errno));
    else s = deft_read_params(&r, params, n, staged);
    if (r.f) fclose(r.f);
    if (s == DEFT_OK) s = deft_param_records_apply("params_load", path, params, n, staged);
    for (int i = 0; staged && i < n; i++) free(staged[i]);
    free(staged);
    free(params);
    return s;
}
