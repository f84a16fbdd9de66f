/* Training-state files (include/deft/data.h; the layout: train_state_format.h): saving, and reading a file's header.
 *
 * A save gathers everything while the program stands still (the host waits for its queued runs first), and writes
 * it to a temporary file beside path that replaces path only once complete and flushed to the disk: a crash or a
 * failed write mid-save leaves path as it was, and a failed save leaves no temporary file behind. */
#define _POSIX_C_SOURCE 200809L /* fsync, getpid */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "byte_order.h"
#include "loader_internal.h"
#include "param_records.h"
#include "path.h"
#include "train_state_format.h"

_Static_assert(sizeof(((deft_tensor *)0)->name) == DEFT_TS_NAME_BYTES, "an optimizer list entry holds a node name");

deft_status deft_ts_check_args(const char *who, const char *path, const deft_program *p, const deft_optimizer *opt) {
    if (!path || !p) return deft_set_error(DEFT_ERR_INVALID, "%s: the path and the program must not be NULL", who);
    if (!opt) return DEFT_OK;
    if (opt->graph != p->graph)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: optimizer %s is of another graph than the program", who, path,
                              opt->step_node ? opt->step_node->name : "(no step yet)");
    if (!opt->materialized)
        return deft_set_error(DEFT_ERR_STATE, "%s: %s: optimizer %s has no state yet: compile a program that runs its "
                              "step (deft_optimizer_step) first", who, path,
                              opt->step_node ? opt->step_node->name : "(no step yet)");
    return DEFT_OK;
}

/* ---- the head ---- */

static deft_status deft_ts_head_of(deft_program *p, deft_optimizer *opt, deft_loader *loader, int n_params,
                                   deft_ts_head *h) {
    memset(h, 0, sizeof *h);
    h->n_params = (uint32_t)n_params;
    h->runs = p->run_count;
    if (loader) {
        h->flags |= DEFT_TS_HAS_LOADER;
        deft_loader_position(loader, &h->epoch, &h->index);
        h->per_epoch = deft_loader_batches_per_epoch(loader);
    }
    if (!opt) return DEFT_OK;
    h->flags |= DEFT_TS_HAS_OPTIMIZER;
    h->kind = (uint32_t)opt->kind;
    h->dtype = (uint32_t)opt->dtype;
    h->opt_params = (uint32_t)opt->n_params;
    h->accumulate = (uint32_t)opt->accumulate_steps;
    h->total = opt->total;
    if (deft_optimizer_sharded(opt)) {
        h->world = (uint32_t)opt->zero.world;
        h->rank = (uint32_t)opt->zero.rank;
        h->lo = opt->zero.lo;
        h->hi = opt->zero.hi;
        h->padded = opt->zero.padded;
    }
    deft_status s = deft_optimizer_counters_get(opt, &h->c);
    if (s != DEFT_OK) return s;
    h->arrays = deft_ts_arrays_needed(opt, h->c.micro);
    for (int a = 0; a < DEFT_OPT_ARRAY_COUNT; a++)
        if ((h->arrays >> a & 1u) && !deft_optimizer_array_exists(opt, (deft_optimizer_array)a))
            return deft_set_error(DEFT_ERR_STATE, "optimizer %s holds no %s", opt->step_node->name,
                                  deft_ts_array_name(opt, a));
    return DEFT_OK;
}

static deft_status deft_ts_write_head(deft_file_writer *w, const deft_ts_head *h) {
    unsigned char b[DEFT_TS_HEAD_BYTES_ZERO];
    deft_ts_head_encode(h, b);
    deft_status s = deft_file_write(w, b, deft_ts_head_bytes(h));
    return s == DEFT_OK ? deft_file_write_crc(w, b, deft_ts_head_bytes(h)) : s;
}

/* ---- the optimizer ---- */

static deft_status deft_ts_write_list(deft_file_writer *w, const deft_optimizer *opt) {
    const size_t bytes = (size_t)opt->n_params * DEFT_TS_ENTRY_BYTES;
    unsigned char *b = malloc(bytes ? bytes : 1);
    if (!b) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", w->who);
    for (int i = 0; i < opt->n_params; i++) deft_ts_entry_encode(opt, i, b + (size_t)i * DEFT_TS_ENTRY_BYTES);
    deft_status s = deft_file_write(w, b, bytes);
    if (s == DEFT_OK) s = deft_file_write_crc(w, b, bytes);
    free(b);
    return s;
}

static deft_status deft_ts_write_array(deft_file_writer *w, const deft_optimizer *opt, deft_optimizer_array a) {
    const size_t esz = deft_dtype_size(opt->dtype), bytes = deft_optimizer_array_bytes(opt, a);
    unsigned char head[DEFT_TS_ARRAY_HEAD], *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory for %s (%zu bytes)", w->who,
                                     deft_ts_array_name(opt, a), bytes);
    deft_status s = deft_optimizer_array_read(opt, a, data);
    if (s != DEFT_OK)
        s = deft_set_error(s, "%s: %s: reading %s: %s", w->who, w->path, deft_ts_array_name(opt, a), deft_errmsg());
    if (s == DEFT_OK) {
        deft_elements_to_order(data, bytes, esz, true);
        deft_put_le(head, (uint64_t)a, 4);
        deft_put_le(head + 4, (uint64_t)opt->dtype, 4);
        deft_put_le(head + 8, bytes, 8);
        s = deft_file_write(w, head, sizeof head);
    }
    if (s == DEFT_OK) s = deft_file_write_crc(w, head, sizeof head);
    if (s == DEFT_OK) s = deft_file_write(w, data, bytes);
    if (s == DEFT_OK) s = deft_file_write_crc(w, data, bytes);
    free(data);
    return s;
}

static deft_status deft_ts_write_all(deft_file_writer *w, const deft_ts_head *h, deft_tensor *const *params, int n,
                                     const deft_optimizer *opt) {
    deft_status s = deft_ts_write_head(w, h);
    if (s == DEFT_OK) s = deft_param_records_write(w, params, n);
    if (s != DEFT_OK || !opt) return s;
    s = deft_ts_write_list(w, opt);
    for (int a = 0; a < DEFT_OPT_ARRAY_COUNT && s == DEFT_OK; a++)
        if (h->arrays >> a & 1u) s = deft_ts_write_array(w, opt, (deft_optimizer_array)a);
    return s;
}

/* ---- the file ---- */

/* The bytes reach the disk before the rename publishes them, so that after a crash path names either the old file
 * or the whole new one. */
static deft_status deft_ts_close(FILE *f, const char *path, deft_status s) {
    const char *failed = NULL;
    if (s == DEFT_OK && fflush(f) != 0) failed = "flushing";
    else if (s == DEFT_OK && fsync(fileno(f)) != 0) failed = "syncing";
    int err = errno;
    if (fclose(f) != 0 && s == DEFT_OK && !failed) {
        failed = "closing";
        err = errno;
    }
    if (!failed) return s;
    return deft_set_error(DEFT_ERR_IO, "train_state_save: %s: %s failed: %s; nothing was saved", path, failed,
                          strerror(err));
}

static deft_status deft_ts_save_file(const char *path, const deft_ts_head *h, deft_tensor *const *params, int n,
                                     const deft_optimizer *opt) {
    char tmp[DEFT_PATH_MAX];
    deft_status s = deft_path_format(tmp, sizeof tmp, "train_state_save", "%s.tmp%ld", path, (long)getpid());
    if (s != DEFT_OK) return s;
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return deft_set_error(DEFT_ERR_IO, "train_state_save: %s: cannot create the temporary file %s: %s", path, tmp,
                              strerror(errno));
    deft_file_writer w = {f, "train_state_save", path, "nothing was saved"};
    s = deft_ts_close(f, path, deft_ts_write_all(&w, h, params, n, opt));
    if (s == DEFT_OK && rename(tmp, path) != 0)
        s = deft_set_error(DEFT_ERR_IO, "train_state_save: %s: cannot rename %s to it: %s; nothing was saved", path,
                           tmp, strerror(errno));
    if (s != DEFT_OK) remove(tmp);
    return s;
}

deft_status deft_train_state_save(const char *path, deft_program *p, deft_optimizer *opt, deft_loader *loader) {
    deft_status s = deft_ts_check_args("train_state_save", path, p, opt);
    if (s == DEFT_OK) s = deft_program_wait_idle(p);
    if (s != DEFT_OK) return s;
    deft_tensor **params;
    int n;
    s = deft_params_collect(p->graph, "train_state_save", path, &params, &n);
    if (s != DEFT_OK) return s;
    deft_ts_head h;
    s = deft_ts_head_of(p, opt, loader, n, &h);
    if (s != DEFT_OK) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", deft_errmsg());
        s = deft_set_error(s, "train_state_save: %s: %s", path, msg);
    }
    if (s == DEFT_OK) s = deft_ts_save_file(path, &h, params, n, opt);
    free(params);
    return s;
}

/* ---- reading the head ---- */

deft_status deft_ts_read_head(deft_file_reader *r, deft_ts_head *h) {
    unsigned char b[DEFT_TS_HEAD_BYTES_ZERO];
    deft_status s = deft_file_read(r, b, DEFT_TS_MAGIC_LEN, "the header");
    if (s != DEFT_OK) return s;
    if (memcmp(b, DEFT_TS_MAGIC, DEFT_TS_MAGIC_LEN) != 0)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: bad magic: not a deft training-state file (it does not start "
                              "with \"" DEFT_TS_MAGIC "\")", r->who, r->path);
    s = deft_file_read(r, b + DEFT_TS_MAGIC_LEN, 4, "the header");
    const uint64_t version = s == DEFT_OK ? deft_get_le(b + DEFT_TS_MAGIC_LEN, 4) : 0;
    if (s == DEFT_OK && version != DEFT_TS_VERSION && version != DEFT_TS_VERSION_ZERO)
        return deft_set_error(DEFT_ERR_IO, "%s: %s: format version %llu; this build reads versions %u and %u (ZeRO-1)",
                              r->who, r->path, (unsigned long long)version, DEFT_TS_VERSION, DEFT_TS_VERSION_ZERO);
    const size_t n = version == DEFT_TS_VERSION_ZERO ? DEFT_TS_HEAD_BYTES_ZERO : DEFT_TS_HEAD_BYTES;
    if (s == DEFT_OK) s = deft_file_read(r, b + DEFT_TS_MAGIC_LEN + 4, n - DEFT_TS_MAGIC_LEN - 4, "the header");
    if (s == DEFT_OK) s = deft_file_check_crc(r, b, n, "the header", "the file's header");
    if (s == DEFT_OK) deft_ts_head_decode(b, (uint32_t)version, h);
    return s;
}

deft_status deft_train_state_info(const char *path, deft_train_state_summary *out) {
    if (!path || !out) return deft_set_error(DEFT_ERR_INVALID, "train_state_info: the path and out must not be NULL");
    deft_file_reader r = {fopen(path, "rb"), "train_state_info", path, 0};
    if (!r.f) return deft_set_error(DEFT_ERR_IO, "train_state_info: %s: cannot open: %s", path, strerror(errno));
    deft_ts_head h;
    deft_status s = deft_ts_read_head(&r, &h);
    fclose(r.f);
    if (s != DEFT_OK) return s;
    memset(out, 0, sizeof *out);
    out->runs = h.runs;
    out->has_optimizer = (h.flags & DEFT_TS_HAS_OPTIMIZER) != 0;
    out->updates = out->has_optimizer ? h.c.updates : 0;
    out->lr = out->has_optimizer ? h.c.lr : 0.0;
    out->has_loader = (h.flags & DEFT_TS_HAS_LOADER) != 0;
    out->epoch = out->has_loader ? h.epoch : 0;
    out->index = out->has_loader ? h.index : 0;
    return DEFT_OK;
}
