/* The memory planner: buffer lifetimes in, arena offsets out. Pure: it touches no device. */
#ifndef DEFT_PLANNER_H
#define DEFT_PLANNER_H

#include <stddef.h>

#include "deft.h"

#define DEFT_PLAN_ALIGN 256   /* offsets and sizes are multiples of this: what cuBLAS and vector loads like */

typedef struct deft_plan_buffer {
    size_t size;      /* bytes asked for */
    int first, last;  /* steps of its first write and last read, first <= last */
    size_t offset;    /* out: where it lives in the arena */
} deft_plan_buffer;

typedef struct deft_plan_stats {
    size_t arena_bytes;      /* the arena the offsets need */
    size_t lower_bound;      /* the largest sum of (aligned) bytes live at any one step */
    size_t no_reuse_bytes;   /* the arena if nothing were shared */
} deft_plan_stats;

/* Assigns offsets so that no two buffers live at the same step overlap. no_reuse gives every buffer its own range.
 * Returns DEFT_ERR_INVALID for a buffer with last < first, DEFT_ERR_SHAPE when the aligned sizes sum past
 * DEFT_MAX_BYTES (base/checked.h), DEFT_ERR_OOM when scratch memory runs out. */
deft_status deft_plan_offsets(deft_plan_buffer *bufs, int n, int no_reuse, deft_plan_stats *stats);

/* The largest sum of aligned sizes live at one step: no placement of bufs needs less. O(n log n). SIZE_MAX when the
 * sizes sum past DEFT_MAX_BYTES. */
size_t deft_plan_lower_bound(const deft_plan_buffer *bufs, int n);

/* bytes must be at most DEFT_MAX_BYTES, which the planner checks. */
static inline size_t deft_plan_align(size_t bytes) {
    return (bytes + DEFT_PLAN_ALIGN - 1) & ~(size_t)(DEFT_PLAN_ALIGN - 1);
}

#endif
