/* The compile option param_copies at run time: each optimizer's low-precision copy of its parameters (ir/optimizer.h's
 * flat_low), made when the first program reading it is compiled, bound to that program's DEFT_OP_PARAM_COPY nodes,
 * and written whole again before a run whenever the parameters were written outside a step. Each update writes the
 * copy itself (ops/cpu/cpu_optimizer.c, ops/cuda/cuda_optimizer_math.cuh), so in steady training nothing here runs. */

#include "checked.h"
#include "cpu_kernels.h"
#include "device_internal.h"
#include "optimizer.h"
#include "optimizer_storage.h"
#include "param_copies.h"
#include "program_graph.h"
#include "program_run.h"
#include "zero_f32.h"
#ifdef DEFT_HAVE_CUDA
#include "cuda_kernels.h"
#endif

static deft_status deft_copy_make(deft_optimizer *o, deft_dtype dt) {
    size_t bytes = 0;
    /* Under ZeRO-1 the padded storage, which the step's all-gather fills (each rank's slice from its update). */
    if (!deft_size_mul((size_t)deft_optimizer_flat_count(o), deft_dtype_size(dt), &bytes))
        return deft_set_error(DEFT_ERR_INVALID, "compile: the parameter copies of %s overflow the address space",
                              o->step_node->name);
    deft_status s = deft_mem_alloc_tagged(o->device, bytes ? bytes : 1, "optimizer.param_copies", &o->flat_low);
    if (s != DEFT_OK) return s;
    o->low_dtype = dt;
    o->low_stale = true;   /* written from the parameters before the first run that reads it */
    return DEFT_OK;
}

deft_status deft_param_copy_bind(const deft_program *p, deft_tensor *t, bool *made) {
    *made = false;
    int i = -1;
    deft_optimizer *o = deft_optimizer_of_param(t->graph, t->src[0], &i);
    if (!o || !o->materialized)
        return deft_set_error(DEFT_ERR_STATE, "compile: %s is the copy of %s, whose optimizer has no storage yet",
                              t->name, t->src[0]->name);
    if (o->flat_low && o->low_dtype != t->dtype)
        return deft_set_error(DEFT_ERR_STATE,
                              "compile: the optimizer of %s keeps %s copies of its parameters for another program; "
                              "this one reads them in %s: compile it without param_copies", t->src[0]->name,
                              deft_dtype_name(o->low_dtype), deft_dtype_name(t->dtype));
    /* A program that steps o already may have captured its step into a CUDA Graph that writes no copy: the copy is
     * made by the first program that steps or reads o, or not at all. */
    const deft_tensor *other = o->flat_low ? NULL : deft_optimizer_other_step(p, o, true, NULL, NULL);
    if (other)
        return deft_set_error(DEFT_ERR_STATE,
                              "compile: %s is the copy of %s, whose optimizer a live program compiled without "
                              "param_copies steps (%s); compile every program that steps it with param_copies, or "
                              "free that one first", t->name, t->src[0]->name, other->name);
    if (!o->flat_low) {
        deft_status s = deft_copy_make(o, t->dtype);
        if (s != DEFT_OK)
            return deft_set_error(s, "compile: the %s copies of the parameters of %s: %s", deft_dtype_name(t->dtype),
                                  o->step_node->name, deft_errmsg());
        *made = true;
    }
    char *at = (char *)o->flat_low + (size_t)o->offsets[i] * deft_dtype_size(t->dtype);
    if (o->device.type == DEFT_CPU) t->host_data = at;
    else t->dev_data = at;
    t->storage_borrowed = true;
    return DEFT_OK;
}

void deft_param_copy_unmake(deft_tensor *t) {
    deft_optimizer *o = deft_optimizer_of_param(t->graph, t->src[0], NULL);
    if (!o || !o->flat_low) return;
    deft_optimizer_unbind_copies(o);
    deft_optimizer_zero_f32_forget(o);
    deft_mem_free(o->device, o->flat_low);
    o->flat_low = NULL;
    o->low_stale = false;
}

void deft_param_copies_mark_stale(deft_graph *g, const deft_tensor *param) {
    for (int i = 0; i < g->n_optimizers; i++) {
        deft_optimizer *o = g->optimizers[i];
        if (o->flat_low && (!param || deft_optimizer_of_param(g, param, NULL) == o)) o->low_stale = true;
    }
}

/* One optimizer's copy written whole: on the CPU at once, on a GPU queued on the program's stream when it runs on
 * that GPU (else on the device's default stream, waited for). */
static deft_status deft_copy_refresh(const deft_program *p, deft_optimizer *o) {
    if (o->device.type == DEFT_CPU) {
        deft_cpu_optimizer_copy_refresh(o);
        return DEFT_OK;
    }
#ifdef DEFT_HAVE_CUDA
    const bool own = p->gpu && p->gpu->device == o->device.index;
    deft_status s = deft_cuda_set_device(o->device.index);
    if (s == DEFT_OK) s = deft_cuda_optimizer_copy_refresh(o, own ? p->gpu->stream : NULL);
    if (s == DEFT_OK && !own) s = deft_device_synchronize(o->device);
    return s;
#else
    (void)p;
    return deft_set_error(DEFT_ERR_NO_CUDA, "run: the parameter copies of %s are on a GPU, but deft was built without "
                          "CUDA", o->step_node->name);
#endif
}

deft_status deft_param_copies_refresh(const deft_program *p) {
    deft_graph *g = p->graph;
    for (int i = 0; i < g->n_optimizers; i++) {
        deft_optimizer *o = g->optimizers[i];
        if (!o->flat_low || !o->low_stale) continue;
        /* Written from the f32 values, which are stale here outside this rank's slice. */
        deft_status s = deft_graph_check_f32_current(g, "run (the parameter copies written anew)");
        if (s == DEFT_OK) s = deft_copy_refresh(p, o);
        if (s != DEFT_OK) return s;
        o->low_stale = false;
    }
    return DEFT_OK;
}
