/* Reading and writing an optimizer's state where it lives, and waiting for a program (optimizer_state.h). On a GPU
 * the counters are one struct on the device (deft_optimizer_dev) that the steps' kernels advance: it is read back
 * whole, and written back whole with its per-run fields as a run leaves them, so that a step captured into a CUDA
 * Graph before the write reads the new values on its next replay (the addresses never change). */
#include <string.h>

#include "device_internal.h"
#include "optimizer_state.h"
#include "program_graph.h"
#include "replica_hooks.h"

static deft_status deft_opt_sync(const deft_optimizer *opt) {
    return opt->device.type == DEFT_CPU ? DEFT_OK : deft_device_synchronize(opt->device);
}

deft_status deft_optimizer_counters_get(const deft_optimizer *opt, deft_optimizer_counters *out) {
    memset(out, 0, sizeof *out);
    out->scaling_started = opt->scaler.started;
    out->lr = opt->lr;   /* on a GPU, set_lr keeps this mirror of the device's rate */
    if (!opt->dev) {
        out->updates = opt->updates;
        out->micro = opt->micro;
        out->last_norm = opt->last_norm;
        out->loss_scale = opt->scaler.scale;
        out->growth_tracker = opt->scaler.tracker;
        out->skipped = opt->scaler.skipped;
        return DEFT_OK;
    }
    deft_optimizer_dev d;
    deft_status s = deft_opt_sync(opt);
    if (s == DEFT_OK) s = deft_mem_copy(deft_cpu(), &d, opt->device, opt->dev, sizeof d);
    if (s != DEFT_OK) return s;
    out->updates = d.updates;
    out->micro = d.micro;
    out->last_norm = d.last_norm;
    out->loss_scale = d.loss_scale;
    out->growth_tracker = d.growth_tracker;
    out->skipped = d.skipped;
    return DEFT_OK;
}

deft_status deft_optimizer_counters_set(deft_optimizer *opt, const deft_optimizer_counters *c) {
    if (opt->dev) {
        deft_optimizer_dev d;
        deft_status s = deft_opt_sync(opt);
        if (s == DEFT_OK) s = deft_mem_copy(deft_cpu(), &d, opt->device, opt->dev, sizeof d);
        if (s != DEFT_OK) return s;
        d.updates = c->updates;
        d.micro = c->micro;
        d.lr = c->lr;
        d.last_norm = (float)c->last_norm;
        d.loss_scale = c->loss_scale;
        d.growth_tracker = c->growth_tracker;
        d.skipped = c->skipped;
        d.blocks_done = 0;   /* as the last block of a one-launch step leaves it */
        s = deft_mem_copy(opt->device, opt->dev, deft_cpu(), &d, sizeof d);
        if (s != DEFT_OK) return s;
    }
    /* The host's fields too: on a GPU they are unused, and kept equal for anyone reading them. */
    opt->updates = c->updates;
    opt->micro = c->micro;
    opt->lr = c->lr;
    opt->last_norm = c->last_norm;
    opt->scaler.scale = c->loss_scale;
    opt->scaler.tracker = c->growth_tracker;
    opt->scaler.skipped = c->skipped;
    return DEFT_OK;
}

static void *deft_opt_array(const deft_optimizer *opt, deft_optimizer_array a) {
    switch (a) {
    case DEFT_OPT_ARRAY_GRADS: return opt->flat_grads;
    case DEFT_OPT_ARRAY_STATE0: return opt->state0;
    case DEFT_OPT_ARRAY_STATE1: return opt->state1;
    default: return NULL;
    }
}

bool deft_optimizer_array_exists(const deft_optimizer *opt, deft_optimizer_array a) {
    return deft_opt_array(opt, a) != NULL;
}

size_t deft_optimizer_array_bytes(const deft_optimizer *opt, deft_optimizer_array a) {
    const int64_t n = a == DEFT_OPT_ARRAY_GRADS ? deft_optimizer_grad_count(opt) : deft_optimizer_state_count(opt);
    return (size_t)n * deft_dtype_size(opt->dtype);
}

deft_status deft_optimizer_array_read(const deft_optimizer *opt, deft_optimizer_array a, void *host) {
    const void *src = deft_opt_array(opt, a);
    if (!src) return deft_set_error(DEFT_ERR_STATE, "optimizer %s holds no such state", opt->step_node->name);
    deft_status s = deft_opt_sync(opt);
    return s == DEFT_OK ? deft_mem_copy(deft_cpu(), host, opt->device, src, deft_optimizer_array_bytes(opt, a)) : s;
}

deft_status deft_optimizer_array_write(deft_optimizer *opt, deft_optimizer_array a, const void *host) {
    void *dst = deft_opt_array(opt, a);
    if (!dst) return deft_set_error(DEFT_ERR_STATE, "optimizer %s holds no such state", opt->step_node->name);
    deft_status s = deft_opt_sync(opt);
    return s == DEFT_OK ? deft_mem_copy(opt->device, dst, deft_cpu(), host, deft_optimizer_array_bytes(opt, a)) : s;
}

deft_status deft_program_wait_idle(deft_program *p) {
    deft_status s = p->gpu && p->gpu->device >= 0 ? deft_lanes_wait_idle(p) : DEFT_OK;
    if (s == DEFT_OK && p->ddp) s = deft_replica_hooks_get()->wait(p);
    return s;
}
