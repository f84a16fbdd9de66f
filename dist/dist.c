/* deft_dist: NCCL communicators for data parallel training, made for every local GPU at once or for one rank that
 * meets the others through a rendezvous (deft_dist_run, which runs the local replicas' steps together, is in
 * dist/dist_run.c). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "dist.h"
#include "graph_internal.h"

/* NVLink multicast objects can take a shared host's GPUs out of service: never asked for, unless the user's
 * environment says otherwise. */
static void deft_dist_env(void) { setenv("NCCL_NVLS_ENABLE", "0", 0); }

static deft_status deft_dist_timeout(double t, double *out) {
    if (t < 0 || t != t) return deft_set_error(DEFT_ERR_INVALID, "dist: the timeout must be >= 0 s (0: %.0f s)",
                                               DEFT_DIST_DEFAULT_TIMEOUT);
    *out = t == 0 ? DEFT_DIST_DEFAULT_TIMEOUT : t;
    return DEFT_OK;
}

static deft_status deft_dist_need_nccl(void) {
    if (deft_has_nccl_build()) return DEFT_OK;
    return deft_set_error(DEFT_ERR_NO_CUDA, "dist: deft was built without NCCL (DEFT_NCCL=OFF or no NCCL found)");
}

static deft_status deft_dist_blocks(const char *what, int asked, int *out) {
    if (asked < 0 || asked > DEFT_DIST_MAX_BLOCKS)
        return deft_set_error(DEFT_ERR_INVALID, "%s: collective_blocks %d: 0 (the default, %d) or 1..%d", what, asked,
                              DEFT_DIST_DEFAULT_BLOCKS, DEFT_DIST_MAX_BLOCKS);
    *out = asked == 0 ? DEFT_DIST_DEFAULT_BLOCKS : asked;
    return DEFT_OK;
}

deft_status deft_dist_init_local(int ngpus, double timeout_s, deft_dist **out) {
    return deft_dist_init_local_with(&(deft_dist_local_options){.ngpus = ngpus, .timeout_s = timeout_s}, out);
}

deft_status deft_dist_init_local_with(const deft_dist_local_options *o, deft_dist **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "dist_init_local: out is NULL");
    *out = NULL;
    if (!o) return deft_set_error(DEFT_ERR_INVALID, "dist_init_local: options are NULL");
    const int ngpus = o->ngpus;
    if (ngpus < 1 || ngpus > DEFT_DIST_MAX_LOCAL)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init_local: %d GPUs asked for (1..%d)", ngpus,
                              DEFT_DIST_MAX_LOCAL);
    double timeout = 0;
    int blocks = 0;
    deft_status s = deft_dist_timeout(o->timeout_s, &timeout);
    if (s == DEFT_OK) s = deft_dist_blocks("dist_init_local", o->collective_blocks, &blocks);
    if (s == DEFT_OK) s = deft_dist_need_nccl();
    if (s != DEFT_OK) return s;
    const int have = deft_cuda_device_count();
    if (have == 0) return deft_set_error(DEFT_ERR_NO_CUDA, "dist_init_local: no usable GPU");
    if (ngpus > have)
        return deft_set_error(DEFT_ERR_DEVICE, "dist_init_local: %d GPUs asked for, %d visible", ngpus, have);
    deft_dist *d = calloc(1, sizeof *d);
    if (!d) return deft_set_error(DEFT_ERR_OOM, "dist_init_local: out of host memory");
    *d = (deft_dist){.world = ngpus, .n_local = ngpus, .timeout_s = timeout, .blocks = blocks};
    for (int i = 0; i < ngpus; i++) d->rank[i] = d->device[i] = i;
    deft_dist_env();
    s = deft_nccl_init_local(d);
    if (s != DEFT_OK) {
        free(d);
        return s;
    }
    deft_ddp_register();
    *out = d;
    return DEFT_OK;
}

static deft_status deft_dist_check_options(const deft_dist_options *o, int *device, double *timeout, int *blocks) {
    if (!o) return deft_set_error(DEFT_ERR_INVALID, "dist_init: options are NULL");
    if (o->world < 1 || o->world > DEFT_DIST_MAX_WORLD || o->rank < 0 || o->rank >= o->world)
        return deft_set_error(DEFT_ERR_INVALID, "dist_init: rank %d of a world of %d (rank in [0, world), world "
                              "in 1..%d)", o->rank, o->world, DEFT_DIST_MAX_WORLD);
    if (!o->rendezvous || (strncmp(o->rendezvous, "file:", 5) != 0 && strncmp(o->rendezvous, "tcp:", 4) != 0))
        return deft_set_error(DEFT_ERR_INVALID, "dist_init: the rendezvous must be \"file:PATH\" or "
                              "\"tcp:HOST:PORT\", not \"%s\"", o->rendezvous ? o->rendezvous : "(null)");
    deft_status s = deft_dist_timeout(o->timeout_s, timeout);
    if (s == DEFT_OK) s = deft_dist_blocks("dist_init", o->collective_blocks, blocks);
    if (s == DEFT_OK) s = deft_dist_need_nccl();
    if (s != DEFT_OK) return s;
    const int have = deft_cuda_device_count();
    if (have == 0) return deft_set_error(DEFT_ERR_NO_CUDA, "dist_init: rank %d has no usable GPU", o->rank);
    *device = o->device < 0 ? o->rank % have : o->device;
    if (*device >= have)
        return deft_set_error(DEFT_ERR_DEVICE, "dist_init: rank %d asks for cuda:%d, %d visible", o->rank, *device,
                              have);
    return DEFT_OK;
}

deft_status deft_dist_init(const deft_dist_options *o, deft_dist **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "dist_init: out is NULL");
    *out = NULL;
    int device = 0, blocks = 0;
    double timeout = 0;
    deft_status s = deft_dist_check_options(o, &device, &timeout, &blocks);
    if (s != DEFT_OK) return s;
    deft_dist_env();
    unsigned char id[DEFT_DIST_ID_BYTES] = {0};
    if (o->rank == 0) s = deft_nccl_unique_id(id);
    if (s == DEFT_OK) s = deft_rendezvous(o->rendezvous, o->rank, o->world, id, sizeof id, timeout);
    if (s != DEFT_OK) return s;
    deft_dist *d = calloc(1, sizeof *d);
    if (!d) return deft_set_error(DEFT_ERR_OOM, "dist_init: out of host memory");
    *d = (deft_dist){.world = o->world, .n_local = 1, .timeout_s = timeout, .blocks = blocks};
    d->rank[0] = o->rank;
    d->device[0] = device;
    s = deft_nccl_init_rank(d, id);
    if (s != DEFT_OK) {
        free(d);
        return s;
    }
    deft_ddp_register();
    *out = d;
    return DEFT_OK;
}

void deft_dist_free(deft_dist *d) {
    if (!d) return;
    deft_dist_workers_stop(d);
    deft_nccl_destroy(d);
    free(d);
}

int deft_dist_world(const deft_dist *d) { return d ? d->world : 0; }
int deft_dist_local_count(const deft_dist *d) { return d ? d->n_local : 0; }
int deft_dist_rank(const deft_dist *d, int local) { return d && local >= 0 && local < d->n_local ? d->rank[local] : -1; }

deft_device deft_dist_device(const deft_dist *d, int local) {
    if (!d || local < 0 || local >= d->n_local) return deft_cpu();
    return deft_cuda(d->device[local]);
}
