/* The checks every dataset's batch call makes on its arguments (data/dataset.c, data/cifar_batch.c): the
 * samples [start, start + batch) within the dataset's n, and every index of `order` (may be NULL) within [0, n).
 * `what` names the call in the message. */
#ifndef DEFT_BATCH_RANGE_H
#define DEFT_BATCH_RANGE_H

#include "graph_internal.h"

deft_status deft_batch_range_check(const char *what, int64_t n, const int64_t *order, int64_t start, int64_t batch);

#endif
