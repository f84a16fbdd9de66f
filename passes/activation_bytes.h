/* The activation memory of a compiled program, read from its plan (passes/activation_bytes.c). */
#ifndef DEFT_ACTIVATION_BYTES_H
#define DEFT_ACTIVATION_BYTES_H

#include "program_state.h"

/* Per arena of p (p->n_arenas entries): the largest sum, over the steps, of the planned bytes of saved activations
 * live at that step. A saved activation is a forward value (an ancestor of a loss that deft_backward, or the autocast
 * rewrite, differentiated) that depends on an input, lives in the arena, and is read by a step outside the forward
 * pass (the backward pass, the optimizer); it counts from the first write of its buffer to its last such read. Values
 * of parameters alone (autocast's weight casts) are not activations. */
deft_status deft_activation_peaks(const deft_program *p, size_t *per_arena);

#endif
