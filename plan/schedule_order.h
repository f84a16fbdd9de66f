/* Reordering a schedule to lower its peak memory. Pure: it touches no device. */
#ifndef DEFT_SCHEDULE_ORDER_H
#define DEFT_SCHEDULE_ORDER_H

#include <stddef.h>

#include "deft.h"

typedef struct deft_order_step {
    size_t bytes;         /* what the step's output occupies from the step until its last reader (0: nothing) */
    int keep_alive;       /* 1: the output lives to the end (a program output) */
    int dep_begin, dep_end;   /* its inputs: deps[dep_begin .. dep_end) are indices of earlier steps */
} deft_order_step;

/* Writes to order[0..n) a topological order of the n steps (0, 1, ..., n-1 is one) that keeps the largest sum of
 * bytes live at any step low. A step's output is live from the step until its last reader in the new order (both
 * included), or to the end when kept alive. Only dependencies constrain the order; a dependency listed twice counts
 * once. The order's peak is never above that of 0, 1, ..., n-1, which is returned unless another is strictly lower.
 * Time O((n + dependencies) log n). Returns DEFT_ERR_INVALID for a dependency on a later or unknown step (or the
 * step itself) and DEFT_ERR_OOM when scratch memory runs out, leaving order as it was. */
deft_status deft_schedule_order(const deft_order_step *steps, int n, const int *deps, int *order);

#endif
