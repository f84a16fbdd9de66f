/* A trace of one step (deft_program_trace, runtime/trace.c): every step timed on its stream, written as a Chrome
 * trace-event file. The CUDA events it times GPU steps with: runtime/trace_cuda.c, or trace_nocuda.c without CUDA. */
#ifndef DEFT_TRACE_H
#define DEFT_TRACE_H

#include "graph_internal.h"

struct deft_program;
typedef struct deft_trace deft_trace;

/* Around step i of a traced run (runtime/execute.c): `stream` is the step's, NULL for a step on the host. */
deft_status deft_trace_step_begin(deft_trace *tr, int i, void *stream);
deft_status deft_trace_step_end(deft_trace *tr, int i, void *stream);

/* One step of p as deft_program_run, but eager (no graph captured or replayed), each step timed by tr. */
deft_status deft_program_run_traced(struct deft_program *p, deft_trace *tr);

/* CUDA events that keep time, on `device` (recorded and freed by deft_prefetch_cuda_record / _event_free).
 * event_ms waits for `to`, then gives the milliseconds from `from`. */
deft_status deft_trace_event_new(int device, void **event);
deft_status deft_trace_event_ms(int device, void *from, void *to, float *ms);

#endif
