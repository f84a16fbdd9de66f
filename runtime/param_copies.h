/* The compile option param_copies at run time (runtime/param_copies.c): optimizers' low-precision parameter copies. */
#ifndef DEFT_PARAM_COPIES_H
#define DEFT_PARAM_COPIES_H

#include "graph_internal.h"

struct deft_program;
/* Points t (a DEFT_OP_PARAM_COPY node a program needs) into its optimizer's copy, making the copy when it is the
 * first (*made then true): DEFT_ERR_STATE when the optimizer has no storage, keeps copies in another dtype, or has
 * none yet while another live program of p's graph steps it (its captured step would write none), or the
 * allocator's status. */
deft_status deft_param_copy_bind(const struct deft_program *p, deft_tensor *t, bool *made);
/* Gives back the copy that deft_param_copy_bind made for t (a compile that failed later), unbinding every node. */
void deft_param_copy_unmake(deft_tensor *t);
/* Whatever wrote `param` (NULL: every parameter) outside a step: its optimizer's copy is written whole before the
 * next run. */
void deft_param_copies_mark_stale(deft_graph *g, const deft_tensor *param);
/* Before a run of p: every stale copy of p's graph written from the parameters (queued on p's stream on its GPU). */
deft_status deft_param_copies_refresh(const struct deft_program *p);

#endif
