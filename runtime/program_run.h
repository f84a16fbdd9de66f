/* What the runtime's own files share about compiled programs: compiling, their data, their runs. */
#ifndef DEFT_PROGRAM_RUN_H
#define DEFT_PROGRAM_RUN_H

#include "program_state.h"

/* deft_compile, returning its status. */
deft_status deft_compile_into(deft_graph *g, deft_tensor *const *outputs, int n_outputs,
                              const deft_compile_options *opts, deft_program **out);

/* DEFT_ERR_INVALID / DEFT_ERR_STATE (with message) unless t is a node of p's graph as compiled; `what` names the
 * caller in the message. */
deft_status deft_check_program_tensor(const deft_program *p, const deft_tensor *t, const char *what);

/* The address of node id's value in a compiled program (persistent storage, arena, or a view into either). */
void *deft_program_data(const deft_program *p, int id);

/* Runs group g (its root's step) on `stream`; runtime/fusion_run.c. */
deft_status deft_group_run(deft_program *p, const deft_group *g, void *stream);

/* deft_device_errors_take for every GPU on which p runs a kernel that records errors; DEFT_OK at no cost for the
 * others. */
deft_status deft_program_take_device_errors(const deft_program *p);
/* The device error records p's kernels write, made now if they do not exist yet (at compile, before any run). */
deft_status deft_program_make_device_errors(const deft_program *p);
/* What p's first run would build (cuDNN's attention plans, the cuBLAS and cuBLASLt handles, the optimizers' gather
 * tables), built now (runtime/kernel_prepare.c). */
deft_status deft_program_prepare_kernels(const deft_program *p);

/* Loss scaling switched on or off in the optimizers whose steps p runs, as its compiled steps say; runtime/optimizer_storage.c.
 * A step another live program runs the other way is DEFT_ERR_STATE. */
deft_status deft_autocast_configure_steps(deft_program *p);

#endif
