/* Steps a GPU has no kernel for, refused at compile (passes/gpu_support.c). */
#ifndef DEFT_GPU_SUPPORT_H
#define DEFT_GPU_SUPPORT_H

#include "program_state.h"

/* DEFT_ERR_DTYPE naming the first step of p that its GPU cannot run, and why; DEFT_OK when there is none. */
deft_status deft_check_gpu_support(const deft_program *p);

#endif
