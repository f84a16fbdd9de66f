/* ZeRO-1 with low-precision parameter copies (runtime/zero_f32.c; ir/optimizer.h's zero.f32_param and f32_partial):
 * which parameters a replica reads in f32, and the refusals while the other f32 values are current in their owner's
 * slice only. */
#ifndef DEFT_ZERO_F32_H
#define DEFT_ZERO_F32_H

#include "optimizer.h"

struct deft_program;
/* At compile, its last step (so that only a compile that succeeds sets anything): for each sharded optimizer with copies that p steps, the parameters p reads
 * in f32 become its f32 set and their pieces (the first such program); a later one must read no other parameter in
 * f32 (DEFT_ERR_STATE naming it), since the steps captured before broadcast only the set's. */
deft_status deft_program_zero_f32_bind(const struct deft_program *p);
/* The parameters of o (sharded) that p reads in f32, into flags (n_params), and their pieces cut at the slices,
 * into pieces when not NULL; returns how many pieces there are. What the bind above uses; for tests too. */
int64_t deft_zero_f32_plan(const struct deft_program *p, const deft_optimizer *o, bool *flags, deft_zero_f32_piece *pieces);
/* Frees o's f32 set and pieces (its copies or its storage went back). */
void deft_optimizer_zero_f32_forget(deft_optimizer *o);
/* After a run of p: every optimizer p stepped that gathers its copies (deft_optimizer_gathers_low) is partial. */
void deft_program_mark_f32_partial(const struct deft_program *p);
/* Before a run of p: DEFT_ERR_STATE when p reads in f32 a parameter whose f32 value is partial. */
deft_status deft_program_check_f32_reads(const struct deft_program *p);
/* DEFT_ERR_STATE (`what` leading the message) when param's optimizer is partial and param is outside its f32 set
 * (any_param: when it is partial at all). */
deft_status deft_param_check_f32_current(const deft_tensor *param, bool any_param, const char *what);
/* DEFT_ERR_STATE when any optimizer of g is partial (`what` leading the message). */
deft_status deft_graph_check_f32_current(const deft_graph *g, const char *what);
/* The collective's side: after the f32 parameters were all-gathered, o is whole again. */
static inline void deft_optimizer_f32_gathered(deft_optimizer *o) { o->f32_partial = false; }

#endif
