/* Loading a training-state file (include/deft/data.h; the layout: train_state_format.h).
 *
 * The whole file is read and checked first, every value staged in host memory sized from the graph and the optimizer
 * (never from lengths the file gives), and only then is anything set: a file that is truncated, corrupt, or of
 * another model or configuration leaves the parameters, the optimizer, the program and the loader as they were.
 * The header's CRC is checked before its fields are compared with the program, so that a difference there means
 * "another configuration" (DEFT_ERR_INVALID) and not a flipped bit (DEFT_ERR_IO). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "byte_order.h"
#include "loader_internal.h"
#include "param_records.h"
#include "train_state_format.h"

#define WHO "train_state_load"

typedef struct deft_ts_load {
    deft_file_reader r;
    deft_program *p;
    deft_optimizer *opt;
    deft_loader *loader;
    deft_tensor **params;
    int n;
    void **staged;                              /* per parameter, host order */
    void *arrays[DEFT_OPT_ARRAY_COUNT];         /* the optimizer's flat arrays the file holds, host order */
    deft_ts_head h;
} deft_ts_load;

static deft_status deft_ts_invalid(const deft_ts_load *L, const char *what, long long in_file, long long here) {
    return deft_set_error(DEFT_ERR_INVALID, "%s: %s: %s is %lld in the file but %lld here; the file is of another "
                          "model or configuration", WHO, L->r.path, what, in_file, here);
}

static deft_status deft_ts_corrupt(const deft_ts_load *L, const char *what) {
    return deft_set_error(DEFT_ERR_IO, "%s: %s: %s; the file is corrupt", WHO, L->r.path, what);
}

/* ---- the header against the program, the optimizer and the loader ---- */

static deft_status deft_ts_check_presence(const deft_ts_load *L) {
    const deft_ts_head *h = &L->h;
    const char *path = L->r.path;
    if ((h->flags & DEFT_TS_HAS_OPTIMIZER) && !L->opt)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the file holds the state of an optimizer (%s over %u "
                              "parameters) but none was given", WHO, path, deft_ts_kind_name(h->kind), h->opt_params);
    if (!(h->flags & DEFT_TS_HAS_OPTIMIZER) && L->opt)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the file holds no optimizer state, but optimizer %s was given",
                              WHO, path, L->opt->step_node->name);
    if (!(h->flags & DEFT_TS_HAS_LOADER) && L->loader)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the file holds no loader position, but a loader was given",
                              WHO, path);
    return DEFT_OK;
}

/* The optimizer's counters: values no save writes. */
static deft_status deft_ts_check_counters(const deft_ts_load *L) {
    const deft_optimizer_counters *c = &L->h.c;
    if (c->micro < 0 || (uint32_t)c->micro >= L->h.accumulate || c->updates < 0 || c->skipped < 0 ||
        !deft_optimizer_lr_valid(c->lr))
        return deft_ts_corrupt(L, "the optimizer's counters are out of range");
    return DEFT_OK;
}

/* ZeRO-1: a file holds one rank's slice of the state; it loads into the same rank of a world of the same size only
 * (the slice's bounds follow from those and the element count, checked here too against a corrupt head). */
static deft_status deft_ts_check_zero(const deft_ts_load *L) {
    const deft_ts_head *h = &L->h;
    const deft_optimizer_zero *z = &L->opt->zero;
    const char *path = L->r.path;
    if (!h->world && !z->world) return DEFT_OK;
    if (!h->world || !z->world)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's state was saved %s, and is %s here (ZeRO-1, "
                              "the compile option zero_stage, must match)", WHO, path,
                              h->world ? "sharded (ZeRO-1)" : "whole", z->world ? "sharded" : "whole");
    if (h->world != (uint32_t)z->world || h->rank != (uint32_t)z->rank)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's state is rank %u's slice of %u ranks (ZeRO-1), "
                              "and this program is rank %d of %d: load each rank's own file into a world of the same "
                              "size", WHO, path, h->rank, h->world, z->rank, z->world);
    if (h->lo != z->lo || h->hi != z->hi || h->padded != z->padded)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's slice is [%lld, %lld) of %lld in the file but "
                              "[%lld, %lld) of %lld here", WHO, path, (long long)h->lo, (long long)h->hi,
                              (long long)h->padded, (long long)z->lo, (long long)z->hi, (long long)z->padded);
    return DEFT_OK;
}

static deft_status deft_ts_check_optimizer(const deft_ts_load *L) {
    const deft_ts_head *h = &L->h;
    const deft_optimizer *opt = L->opt;
    const char *path = L->r.path;
    if (h->kind != (uint32_t)opt->kind)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer is %s in the file but %s here", WHO, path,
                              deft_ts_kind_name(h->kind), deft_ts_kind_name((uint32_t)opt->kind));
    if (h->dtype != (uint32_t)opt->dtype)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's state is %s in the file but %s here", WHO, path,
                              h->dtype < DEFT_DTYPE_COUNT ? deft_dtype_name((deft_dtype)h->dtype) : "unknown",
                              deft_dtype_name(opt->dtype));
    if (h->accumulate != (uint32_t)opt->accumulate_steps)
        return deft_ts_invalid(L, "accumulate_steps", h->accumulate, opt->accumulate_steps);
    if ((h->c.scaling_started != 0) != (opt->scaler.started != 0))
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer was saved %s f16 dynamic loss scaling, and runs "
                              "%s it here (compile with the same autocast policy)", WHO, path,
                              h->c.scaling_started ? "with" : "without", opt->scaler.started ? "with" : "without");
    deft_status s = deft_ts_check_counters(L);
    if (s == DEFT_OK) s = deft_ts_check_zero(L);
    if (s != DEFT_OK) return s;
    const uint32_t need = deft_ts_arrays_needed(opt, h->c.micro);
    for (int a = 0; a < DEFT_OPT_ARRAY_COUNT; a++)
        if ((h->arrays >> a & 1u) != (need >> a & 1u))
            return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the file %s %s, which this optimizer %s (SGD's momentum "
                                  "must match)", WHO, path, h->arrays >> a & 1u ? "holds" : "lacks",
                                  deft_ts_array_name(opt, a), need >> a & 1u ? "needs" : "does not keep");
    if (h->arrays >> DEFT_OPT_ARRAY_COUNT)
        return deft_ts_corrupt(L, "the header names optimizer arrays that do not exist");
    return DEFT_OK;
}

static deft_status deft_ts_check_head(const deft_ts_load *L) {
    deft_status s = deft_ts_check_presence(L);
    if (s == DEFT_OK && L->opt) s = deft_ts_check_optimizer(L);
    if (s != DEFT_OK) return s;
    if ((L->h.flags & DEFT_TS_HAS_LOADER) && (L->h.epoch < 0 || L->h.index < 0 || L->h.index > L->h.per_epoch))
        return deft_ts_corrupt(L, "the loader's position is out of range");
    if (!L->loader) return DEFT_OK;
    const int64_t per_epoch = deft_loader_batches_per_epoch(L->loader);
    if (L->h.per_epoch != per_epoch)
        return deft_ts_invalid(L, "the loader's batches per epoch", (long long)L->h.per_epoch, (long long)per_epoch);
    return DEFT_OK;
}

/* ---- the optimizer's parameter list and arrays ---- */

/* Says what differs between entry i as read (`got`) and as this optimizer has it. */
static deft_status deft_ts_entry_differs(const deft_ts_load *L, int i, const unsigned char *got) {
    unsigned char want[DEFT_TS_ENTRY_BYTES];
    deft_ts_entry_encode(L->opt, i, want);
    const char *here = L->opt->params[i]->name;
    char name[DEFT_TS_NAME_BYTES];
    memcpy(name, got, sizeof name);
    name[sizeof name - 1] = '\0';
    if (memcmp(got, want, DEFT_TS_NAME_BYTES) != 0)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's parameter %d is '%s' in the file but '%s' "
                              "here; the file is of another model", WHO, L->r.path, i, name, here);
    const unsigned char *g = got + DEFT_TS_NAME_BYTES, *w = want + DEFT_TS_NAME_BYTES;
    if (memcmp(g, w, 16) != 0)
        return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's parameter '%s' has %lld elements at %lld in "
                              "the file but %lld at %lld here", WHO, L->r.path, here,
                              (long long)deft_get_le(g + 8, 8), (long long)deft_get_le(g, 8),
                              (long long)deft_get_le(w + 8, 8), (long long)deft_get_le(w, 8));
    return deft_set_error(DEFT_ERR_INVALID, "%s: %s: the optimizer's parameter '%s' has weight decay %g and lr_scale "
                          "%g in the file but %g and %g here (its parameter group differs)", WHO, L->r.path, here,
                          deft_bits_f64(deft_get_le(g + 16, 8)), deft_bits_f64(deft_get_le(g + 24, 8)),
                          deft_bits_f64(deft_get_le(w + 16, 8)), deft_bits_f64(deft_get_le(w + 24, 8)));
}

/* After the parameter records, so that a model of other shapes is named by its first parameter that differs. */
static deft_status deft_ts_read_list(deft_ts_load *L) {
    const deft_optimizer *opt = L->opt;
    if (L->h.opt_params != (uint32_t)opt->n_params)
        return deft_ts_invalid(L, "the number of parameters the optimizer updates", L->h.opt_params, opt->n_params);
    if (L->h.total != opt->total)
        return deft_ts_invalid(L, "the optimizer's element count", (long long)L->h.total, (long long)opt->total);
    const size_t bytes = (size_t)L->opt->n_params * DEFT_TS_ENTRY_BYTES;
    unsigned char *b = malloc(bytes ? bytes : 1), want[DEFT_TS_ENTRY_BYTES];
    if (!b) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", WHO);
    deft_status s = deft_file_read(&L->r, b, bytes, "the optimizer's parameter list");
    if (s == DEFT_OK) s = deft_file_check_crc(&L->r, b, bytes, "the optimizer's parameter list",
                                              "the optimizer's parameter list");
    for (int i = 0; s == DEFT_OK && i < L->opt->n_params; i++) {
        deft_ts_entry_encode(L->opt, i, want);
        if (memcmp(b + (size_t)i * DEFT_TS_ENTRY_BYTES, want, sizeof want) != 0)
            s = deft_ts_entry_differs(L, i, b + (size_t)i * DEFT_TS_ENTRY_BYTES);
    }
    free(b);
    return s;
}

static deft_status deft_ts_read_array(deft_ts_load *L, deft_optimizer_array a) {
    const deft_optimizer *opt = L->opt;
    const char *name = deft_ts_array_name(opt, a);
    const size_t esz = deft_dtype_size(opt->dtype), bytes = deft_optimizer_array_bytes(opt, a);
    char what[96];
    snprintf(what, sizeof what, "the header of %s", name);
    unsigned char head[DEFT_TS_ARRAY_HEAD];
    deft_status s = deft_file_read(&L->r, head, sizeof head, what);
    if (s == DEFT_OK) s = deft_file_check_crc(&L->r, head, sizeof head, what, what);
    if (s != DEFT_OK) return s;
    if (deft_get_le(head, 4) != (uint64_t)a || deft_get_le(head + 4, 4) != (uint64_t)opt->dtype ||
        deft_get_le(head + 8, 8) != bytes) {
        snprintf(what, sizeof what, "the header of %s does not match the file's header", name);
        return deft_ts_corrupt(L, what);
    }
    unsigned char *data = malloc(bytes ? bytes : 1);
    if (!data) return deft_set_error(DEFT_ERR_OOM, "%s: out of host memory for %s (%zu bytes)", WHO, name, bytes);
    snprintf(what, sizeof what, "%s", name);
    s = deft_file_read(&L->r, data, bytes, what);
    if (s == DEFT_OK) s = deft_file_check_crc(&L->r, data, bytes, what, what);
    if (s != DEFT_OK) {
        free(data);
        return s;
    }
    deft_elements_to_order(data, bytes, esz, true);
    L->arrays[a] = data;
    return DEFT_OK;
}

/* ---- the whole file ---- */

static deft_status deft_ts_read_all(deft_ts_load *L) {
    deft_status s = deft_ts_read_head(&L->r, &L->h);
    if (s == DEFT_OK) s = deft_ts_check_head(L);
    if (s == DEFT_OK) s = deft_param_records_read(&L->r, L->h.n_params, true, L->params, L->n, L->staged);
    if (s == DEFT_OK) s = deft_param_records_complete(&L->r, L->params, L->n, L->staged);
    if (s == DEFT_OK && L->opt) s = deft_ts_read_list(L);
    for (int a = 0; s == DEFT_OK && L->opt && a < DEFT_OPT_ARRAY_COUNT; a++)
        if (L->h.arrays >> a & 1u) s = deft_ts_read_array(L, (deft_optimizer_array)a);
    return s == DEFT_OK ? deft_file_expect_end(&L->r, "the training state") : s;
}

/* Everything was checked: from here on only a failing device can stop it. The loader goes last, so that its thread
 * fills from the new position once the rest is in place. */
static deft_status deft_ts_apply(deft_ts_load *L) {
    deft_status s = deft_param_records_apply(WHO, L->r.path, L->params, L->n, L->staged);
    for (int a = 0; s == DEFT_OK && L->opt && a < DEFT_OPT_ARRAY_COUNT; a++)
        if (L->arrays[a]) s = deft_optimizer_array_write(L->opt, (deft_optimizer_array)a, L->arrays[a]);
    if (s == DEFT_OK && L->opt) s = deft_optimizer_counters_set(L->opt, &L->h.c);
    if (s != DEFT_OK) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", deft_errmsg());
        return deft_set_error(s, "%s: %s: setting the state: %s", WHO, L->r.path, msg);
    }
    L->p->run_count = L->h.runs;
    return L->loader ? deft_loader_seek(L->loader, L->h.epoch, L->h.index) : DEFT_OK;
}

static void deft_ts_load_free(deft_ts_load *L) {
    if (L->r.f) fclose(L->r.f);
    for (int i = 0; L->staged && i < L->n; i++) free(L->staged[i]);
    free(L->staged);
    for (int a = 0; a < DEFT_OPT_ARRAY_COUNT; a++) free(L->arrays[a]);
    free(L->params);
}

deft_status deft_train_state_load(const char *path, deft_program *p, deft_optimizer *opt, deft_loader *loader) {
    deft_status s = deft_ts_check_args(WHO, path, p, opt);
    if (s == DEFT_OK) s = deft_program_wait_idle(p);
    if (s != DEFT_OK) return s;
    deft_ts_load L;
    memset(&L, 0, sizeof L);
    L.p = p;
    L.opt = opt;
    L.loader = loader;
    L.r = (deft_file_reader){NULL, WHO, path, 0};
    s = deft_params_collect(p->graph, WHO, path, &L.params, &L.n);
    if (s != DEFT_OK) return s;
    L.staged = calloc((size_t)(L.n ? L.n : 1), sizeof *L.staged);
    if (!L.staged) s = deft_set_error(DEFT_ERR_OOM, "%s: out of host memory", WHO);
    if (s == DEFT_OK && !(L.r.f = fopen(path, "rb")))
        s = deft_set_error(DEFT_ERR_IO, "%s: %s: cannot open: %s", WHO, path, strerror(errno));
    if (s == DEFT_OK) s = deft_ts_read_all(&L);
    if (s == DEFT_OK) {
        fclose(L.r.f);
        L.r.f = NULL;
        s = deft_ts_apply(&L);
    }
    deft_ts_load_free(&L);
    return s;
}
