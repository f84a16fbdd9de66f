/* An optimizer's storage, made when a program that runs its step is first compiled: its parameters gathered into one
 * flat block (so that one launch updates them all), its state, and on a GPU the counters, blocks and gather tables
 * its kernels read. The IR builds the optimizer and its step node; everything here holds device memory. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "autocast.h"
#include "optimizer.h"
#include "optimizer_storage.h"
#include "program_run.h"

/* Zeroes `n` elements at element `at` of `base`. */
static deft_status deft_zero_elements(deft_optimizer *opt, void *base, int64_t at, int64_t n) {
    if (n <= 0) return DEFT_OK;
    const size_t esz = deft_dtype_size(opt->dtype), bytes = (size_t)n * esz;
    void *zeros = calloc(1, bytes);
    if (!zeros) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    deft_status s = deft_mem_copy(opt->device, (char *)base + (size_t)at * esz, deft_cpu(), zeros, bytes);
    free(zeros);
    return s;
}

/* ZeRO-1's padding past the parameters: zero in the parameters and in the slice's flat gradients (the rank whose slice
 * holds it), so that the norm and the update over a slice read zeros there (no reduce or gather ever writes it). */
static deft_status deft_zero_padding(deft_optimizer *opt) {
    if (!deft_optimizer_sharded(opt)) return DEFT_OK;
    deft_status s = deft_zero_elements(opt, opt->flat_params, opt->total, opt->zero.padded - opt->total);
    if (s == DEFT_OK && opt->flat_grads) {
        const int64_t from = opt->total > opt->zero.lo ? opt->total - opt->zero.lo : 0;
        s = deft_zero_elements(opt, opt->flat_grads, from, deft_optimizer_grad_count(opt) - from);
    }
    return s;
}

/* Moves each parameter's value into the flat block and points its storage there. */
static deft_status deft_flatten_params(deft_optimizer *opt) {
    const size_t esz = deft_dtype_size(opt->dtype), bytes = (size_t)deft_optimizer_flat_count(opt) * esz;
    const size_t state_bytes = (size_t)deft_optimizer_state_count(opt) * esz;
    const size_t grad_bytes = (size_t)deft_optimizer_grad_count(opt) * esz;
    deft_device d = opt->device;
    deft_status s = deft_mem_alloc_tagged(d, bytes, "optimizer.params", &opt->flat_params);
    if (s == DEFT_OK && deft_optimizer_keeps_grads(opt))
        s = deft_mem_alloc_tagged(d, grad_bytes, "optimizer.grads", &opt->flat_grads);
    if (s == DEFT_OK) s = deft_mem_alloc_tagged(d, state_bytes, "optimizer.state", &opt->state0);
    if (s == DEFT_OK && opt->kind == DEFT_OPTIM_ADAMW)
        s = deft_mem_alloc_tagged(d, state_bytes, "optimizer.state", &opt->state1);
    if (s == DEFT_OK) s = deft_zero_padding(opt);
    if (s != DEFT_OK) return s;
    for (int i = 0; i < opt->n_params; i++) {
        deft_tensor *t = opt->params[i];
        char *slot = (char *)opt->flat_params + (size_t)opt->offsets[i] * esz;
        size_t n = deft_tensor_bytes(t);
        if (d.type == DEFT_CPU) {
            memcpy(slot, t->host_data, n);
            free(t->host_data);
            t->host_data = slot;
        } else {
            s = t->dev_data ? deft_mem_copy(d, slot, d, t->dev_data, n) : deft_mem_copy(d, slot, deft_cpu(), t->host_data, n);
            if (s != DEFT_OK) return s;
            if (t->dev_data) deft_mem_free(d, t->dev_data);
            t->dev_data = slot;
        }
        t->storage_borrowed = true;
    }
    return DEFT_OK;
}

/* On a GPU the per-run state lives on the device (ir/optimizer.h), so that a step (or a CUDA Graph replaying it)
 * advances it without the host. */
static deft_status deft_optimizer_dev_new(deft_optimizer *opt) {
    if (opt->device.type == DEFT_CPU) return DEFT_OK;
    deft_optimizer_dev init;
    memset(&init, 0, sizeof init);
    init.lr = opt->lr;
    init.last_norm = NAN;
    init.loss_scale = 1.0f;
    void *p = NULL;
    deft_status s = deft_mem_alloc_tagged(opt->device, sizeof init, "optimizer.counters", &p);
    if (s == DEFT_OK) s = deft_mem_copy(opt->device, p, deft_cpu(), &init, sizeof init);
    if (s != DEFT_OK) {
        deft_mem_free(opt->device, p);
        return s;
    }
    opt->dev = p;
    return DEFT_OK;
}

deft_status deft_optimizer_set_lr(deft_optimizer *opt, double lr) {
    if (!opt) return deft_set_error(DEFT_ERR_INVALID, "optimizer_set_lr: optimizer is NULL");
    if (!deft_optimizer_lr_valid(lr))
        return deft_set_error(DEFT_ERR_INVALID, "optimizer_set_lr: learning rate %g must be finite and >= 0", lr);
    if (opt->dev) {
        /* Between steps: wait for any step still queued (it reads the old rate), then write the new one; the copy
         * is complete when deft_mem_copy returns, so `lr` (on this stack) may go at once. */
        deft_status s = deft_device_synchronize(opt->device);
        if (s == DEFT_OK)
            s = deft_mem_copy(opt->device, (char *)opt->dev + offsetof(deft_optimizer_dev, lr), deft_cpu(), &lr,
                              sizeof lr);
        if (s != DEFT_OK) return s;
    }
    opt->lr = lr;
    return DEFT_OK;
}

/* On a GPU the count lives on the device: wait for the queued steps and copy it back (-1, with a message, when the
 * device fails). */
int64_t deft_optimizer_updates(const deft_optimizer *opt) {
    if (!opt) return 0;
    if (!opt->dev) return opt->updates;
    int64_t n = -1;
    deft_status s = deft_device_synchronize(opt->device);
    if (s == DEFT_OK)
        s = deft_mem_copy(deft_cpu(), &n, opt->device, (const char *)opt->dev + offsetof(deft_optimizer_dev, updates),
                          sizeof n);
    return s == DEFT_OK ? n : -1;
}

/* Writes the scale (and zeroes the run of clean updates) where the steps read it. */
static deft_status deft_scaler_reset(deft_optimizer *opt, float scale) {
    if (!opt->dev) {
        opt->scaler.scale = scale;
        opt->scaler.tracker = 0;
        return DEFT_OK;
    }
    const int32_t zero = 0;
    deft_status s = deft_mem_copy(opt->device, &opt->dev->loss_scale, deft_cpu(), &scale, sizeof scale);
    if (s == DEFT_OK) s = deft_mem_copy(opt->device, &opt->dev->growth_tracker, deft_cpu(), &zero, sizeof zero);
    return s;
}

deft_status deft_optimizer_set_scaling(deft_optimizer *opt, const deft_loss_scale_options *o) {
    /* Steps still queued read the switch's old value and the scale: let them finish first. */
    if (opt->dev) {
        deft_status s = deft_device_synchronize(opt->device);
        if (s != DEFT_OK) return s;
    }
    if (!o) {
        opt->scaler.on = 0;
        return DEFT_OK;
    }
    if (!opt->scaler.started) {
        deft_status s = deft_scaler_reset(opt, (float)o->init_scale);
        if (s != DEFT_OK) return s;
        opt->scaler.started = 1;
    }
    /* A scaled step keeps flat gradients (deft_optimizer_keeps_grads): one that updated without them until now gets
     * them here. */
    if (!opt->flat_grads && opt->dev) {
        deft_status s = deft_mem_alloc_tagged(opt->device,
                                              (size_t)deft_optimizer_grad_count(opt) * deft_dtype_size(opt->dtype),
                                              "optimizer.grads", &opt->flat_grads);
        if (s != DEFT_OK) return s;
    }
    opt->scaler.on = 1;
    opt->scaler.growth = o->growth_factor;
    opt->scaler.backoff = o->backoff_factor;
    opt->scaler.interval = o->growth_interval;
    return DEFT_OK;
}

deft_status deft_optimizer_loss_scale(const deft_optimizer *opt, double *scale, int64_t *skipped) {
    if (!opt) return deft_set_error(DEFT_ERR_INVALID, "optimizer_loss_scale: optimizer is NULL");
    float sc = opt->scaler.scale;
    int64_t sk = opt->scaler.skipped;
    if (opt->dev) {
        deft_status s = deft_device_synchronize(opt->device);
        if (s == DEFT_OK) s = deft_mem_copy(deft_cpu(), &sc, opt->device, &opt->dev->loss_scale, sizeof sc);
        if (s == DEFT_OK) s = deft_mem_copy(deft_cpu(), &sk, opt->device, &opt->dev->skipped, sizeof sk);
        if (s != DEFT_OK) return s;
    }
    if (scale) *scale = sc;
    if (skipped) *skipped = sk;
    return DEFT_OK;
}

/* The device's copy of the blocks and their sums, for the pieces of a step split over the backward pass. */
static deft_status deft_optimizer_blocks_new(deft_optimizer *o) {
    const size_t n = (size_t)(o->n_blocks > 0 ? o->n_blocks : 1);
    deft_optimizer_block *host = calloc(n, sizeof *host);
    if (!host) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    for (int i = 0; i < o->n_params; i++)
        for (int b = o->block_first[i]; b < o->block_first[i + 1]; b++) {
            deft_optimizer_block_range(o, i, b, &host[b].lo, &host[b].hi);
            host[b].param = i;
        }
    void *blocks = NULL, *sums = NULL;
    deft_status s = deft_mem_alloc_tagged(o->device, n * sizeof *host, "optimizer.blocks", &blocks);
    if (s == DEFT_OK) s = deft_mem_copy(o->device, blocks, deft_cpu(), host, n * sizeof *host);
    if (s == DEFT_OK) s = deft_mem_alloc_tagged(o->device, n * sizeof(double), "optimizer.blocks", &sums);
    free(host);
    if (s != DEFT_OK) {
        deft_mem_free(o->device, blocks);
        deft_mem_free(o->device, sums);
        return s;
    }
    o->dev_blocks = blocks;
    o->dev_block_sums = sums;
    return DEFT_OK;
}

/* The device's copy of the parameter groups (ir/optimizer.h), when there are any: the kernels read a parameter's row
 * by its index. Made once: the groups are fixed from here on (ir/optimizer_groups.c refuses changes). */
static deft_status deft_optimizer_groups_new(deft_optimizer *o) {
    if (!o->groups) return DEFT_OK;
    const size_t bytes = (size_t)o->n_params * sizeof *o->groups;
    void *p = NULL;
    deft_status s = deft_mem_alloc_tagged(o->device, bytes, "optimizer.groups", &p);
    if (s == DEFT_OK) s = deft_mem_copy(o->device, p, deft_cpu(), o->groups, bytes);
    if (s != DEFT_OK) {
        deft_mem_free(o->device, p);
        return s;
    }
    o->dev_groups = p;
    return DEFT_OK;
}

static deft_status deft_optimizer_materialize(deft_optimizer *opt) {
    deft_status s = deft_flatten_params(opt);
    if (s == DEFT_OK) s = deft_optimizer_dev_new(opt);
    if (s == DEFT_OK && opt->dev) s = deft_optimizer_blocks_new(opt);
    if (s == DEFT_OK && opt->dev) s = deft_optimizer_groups_new(opt);
    if (s == DEFT_OK) s = deft_optimizer_zero_blocks_new(opt);
    if (s != DEFT_OK)
        return deft_set_error(s, "compile: flat storage of %s for %lld elements: %s", opt->step_node->name,
                              (long long)opt->total, deft_errmsg());
    opt->materialized = true;
    return DEFT_OK;
}

deft_status deft_optimizers_materialize(deft_graph *g) {
    for (int i = 0; i < g->n_optimizers; i++) {
        deft_optimizer *opt = g->optimizers[i];
        if (!opt->step_node || opt->materialized) continue;
        deft_status s = deft_optimizer_materialize(opt);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

static void deft_gathers_release(deft_optimizer *o) {
    for (int k = 0; k < o->n_gathers; k++) {
        deft_mem_free(o->device, o->gathers[k].table);
        o->gathers[k].table = NULL;
    }
}

void deft_optimizer_release(deft_optimizer *opt) {
    const deft_device d = opt->device;
    /* Steps still queued on a GPU read the flat storage, the state and the gather tables. */
    if (d.type != DEFT_CPU && (opt->dev || opt->n_gathers > 0)) (void)deft_device_synchronize(d);
    for (int i = 0; i < opt->n_parts; i++) deft_gathers_release(opt->parts[i]);
    deft_gathers_release(opt);
    deft_mem_free(d, opt->flat_params);
    deft_mem_free(d, opt->flat_grads);
    deft_mem_free(d, opt->state0);
    deft_mem_free(d, opt->state1);
    deft_mem_free(d, opt->flat_low);
    if (opt->dev) deft_mem_free(d, opt->dev);
    if (opt->dev_blocks) deft_mem_free(d, opt->dev_blocks);
    if (opt->dev_block_sums) deft_mem_free(d, opt->dev_block_sums);
    if (opt->dev_groups) deft_mem_free(d, opt->dev_groups);
    deft_optimizer_zero_release(opt);
    opt->dev_groups = NULL;
    opt->flat_params = opt->flat_grads = opt->state0 = opt->state1 = opt->flat_low = NULL;
    opt->dev = NULL;
    opt->dev_blocks = NULL;
    opt->dev_block_sums = NULL;
}

const deft_tensor *deft_optimizer_other_step(const deft_program *p, const deft_optimizer *opt, bool parts,
                                             bool (*keep)(const deft_graph *, const deft_tensor *, const void *),
                                             const void *ctx) {
    const deft_graph *g = p->graph;
    for (int i = 0; i < g->n_programs; i++) {
        const deft_program *q = g->programs[i];
        if (q == p || !q->nodes) continue;
        for (int id = 0; id < q->n_nodes; id++) {
            const deft_tensor *t = g->nodes[id];
            if (!q->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
            const deft_optimizer *o = t->p.optimizer;
            if (parts && o->part) o = o->part->whole;
            if (o == opt && (!keep || keep(g, t, ctx))) return t;
        }
    }
    return NULL;
}

/* A step of the other kind than *scaled (with loss scaling or without). */
static bool deft_step_other_kind(const deft_graph *g, const deft_tensor *t, const void *scaled) {
    return deft_autocast_step_scaled(g, t) != *(const bool *)scaled;
}

deft_status deft_autocast_configure_steps(deft_program *p) {
    /* A scaled step compiled by hand, outside the f16 policy, runs with GradScaler's defaults (the config's then). */
    deft_loss_scale_options ls = p->config.loss_scale;
    deft_status s = DEFT_OK;
    for (int id = 0; s == DEFT_OK && id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->op != DEFT_OP_OPTIMIZER) continue;
        deft_optimizer *opt = t->p.optimizer;
        bool scaled = deft_autocast_step_scaled(p->graph, t);
        /* Another live program of the graph steps opt with the other kind of step. */
        const deft_tensor *other = deft_optimizer_other_step(p, opt, false, deft_step_other_kind, &scaled);
        if (other)
            return deft_set_error(DEFT_ERR_STATE,
                                  "compile: %s steps its optimizer %s f16 loss scaling, and a live program steps it "
                                  "%s (%s); one optimizer cannot step both ways at once: free that program first",
                                  t->name, scaled ? "with" : "without", scaled ? "without" : "with", other->name);
        if (scaled) s = deft_optimizer_set_scaling(opt, &ls);
        else if (opt->scaler.on) s = deft_optimizer_set_scaling(opt, NULL);
    }
    return s;
}
