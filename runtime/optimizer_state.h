/* An optimizer's state and a program's run counter as training-state files (data/train_state.c) save and restore
 * them: wherever they live (the host's fields on the CPU; the device's counters and flat arrays on a GPU). Each call
 * waits for the steps queued on the optimizer's device first, so it sees (or replaces) the state the last run left. */
#ifndef DEFT_OPTIMIZER_STATE_H
#define DEFT_OPTIMIZER_STATE_H

#include "optimizer.h"
#include "program_state.h"

/* What an optimizer carries from one run to the next besides its flat arrays (ir/optimizer.h). The loss scale's
 * fields are those of the f16 step (deft_optimizer_scaler): meaningful once scaling_started. */
typedef struct deft_optimizer_counters {
    int64_t updates;
    int32_t micro;               /* runs into the current accumulation window */
    double lr;
    double last_norm;            /* the step node's value when a run applies no update */
    int scaling_started;         /* read only: set_counters leaves it to the compile that turned scaling on */
    float loss_scale;
    int32_t growth_tracker;
    int64_t skipped;
} deft_optimizer_counters;

/* The flat arrays an optimizer may hold, each total elements of its dtype; under ZeRO-1 (ir/optimizer.h's
 * deft_optimizer_zero) the state arrays hold this rank's slice [lo, hi) only (element lo first, the slice's padding
 * past the parameters included) and so does the gradients' array (which a ZeRO-1 state file never holds: its steps
 * take one micro-batch per update, so no run leaves a window open). */
typedef enum deft_optimizer_array {
    DEFT_OPT_ARRAY_GRADS,        /* the gradients summed over the runs of the current window (micro of them) */
    DEFT_OPT_ARRAY_STATE0,       /* SGD's momentum buffer, AdamW's first moment */
    DEFT_OPT_ARRAY_STATE1,       /* AdamW's second moment */
    DEFT_OPT_ARRAY_COUNT
} deft_optimizer_array;

/* opt must be materialized (a program running its step was compiled). */
deft_status deft_optimizer_counters_get(const deft_optimizer *opt, deft_optimizer_counters *out);
deft_status deft_optimizer_counters_set(deft_optimizer *opt, const deft_optimizer_counters *c);
/* Whether the array exists (DEFT_OPT_ARRAY_GRADS: only where deft_optimizer_keeps_grads). */
bool deft_optimizer_array_exists(const deft_optimizer *opt, deft_optimizer_array a);
/* Its bytes: total elements, or the slice's under ZeRO-1. */
size_t deft_optimizer_array_bytes(const deft_optimizer *opt, deft_optimizer_array a);
/* Copies the whole array (deft_optimizer_array_bytes) to or from host memory. */
deft_status deft_optimizer_array_read(const deft_optimizer *opt, deft_optimizer_array a, void *host);
deft_status deft_optimizer_array_write(deft_optimizer *opt, deft_optimizer_array a, const void *host);

/* The host waits for p's last run (and a replica's collectives). */
deft_status deft_program_wait_idle(deft_program *p);

#endif
