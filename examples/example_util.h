/* What the training examples share: a monotonic clock for their rate figures and the predicted class of a row of
 * 10 logits. Include after defining _POSIX_C_SOURCE (clock_gettime). */
#ifndef DEFT_EXAMPLE_UTIL_H
#define DEFT_EXAMPLE_UTIL_H

#include <time.h>

static inline double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int argmax10(const float *row) {
    int best = 0;
    for (int k = 1; k < 10; k++)
        if (row[k] > row[best]) best = k;
    return best;
}

#endif
