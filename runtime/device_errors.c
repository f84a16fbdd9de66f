/* Which device error records a program reads when its outputs are read (mem/device_errors.h). */
#include <stdbool.h>

#include "device_errors.h"
#include "program_run.h"
#include "program_state.h"

/* The ops whose CUDA kernels record data errors instead of failing the run (ops/cuda/cuda_cross_entropy.cu,
 * ops/cuda/cuda_gather.cu). */
static bool deft_op_records_device_errors(deft_op op) {
    return op == DEFT_OP_CROSS_ENTROPY || op == DEFT_OP_CROSS_ENTROPY_GRAD || op == DEFT_OP_EMBEDDING ||
           op == DEFT_OP_INDEX_SELECT || op == DEFT_OP_INDEX_ORDER;
}

/* Calls f once for each GPU on which p runs a kernel that records errors. */
static deft_status deft_program_each_error_device(const deft_program *p, deft_status (*f)(int device)) {
    bool seen[DEFT_DEVICE_ERRORS_MAX_DEVICES] = {false};
    for (int id = 0; id < p->n_nodes; id++) {
        const deft_tensor *t = p->graph->nodes[id];
        if (!p->nodes[id].needed || t->device.type != DEFT_CUDA || !deft_op_records_device_errors(t->op)) continue;
        const int d = t->device.index;
        if (d < 0 || d >= DEFT_DEVICE_ERRORS_MAX_DEVICES || seen[d]) continue;
        seen[d] = true;
        deft_status s = f(d);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

deft_status deft_program_take_device_errors(const deft_program *p) {
    return deft_program_each_error_device(p, deft_device_errors_take);
}

static deft_status deft_device_errors_make(int device) {
    deft_device_errors *rec = NULL;
    return deft_device_errors_get(device, NULL, &rec);
}

/* Made at compile, not at the first run: making one waits for the device (the legacy stream's reset), which inside
 * a run would wait for everything the step queued before it. */
deft_status deft_program_make_device_errors(const deft_program *p) {
    return deft_program_each_error_device(p, deft_device_errors_make);
}
