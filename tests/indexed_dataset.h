/* A dataset whose record i is labelled i and whose feature f is 10 i + f, so that a batch shows which records it
 * holds and in what order (the loader tests). */
#ifndef DEFT_TEST_INDEXED_DATASET_H
#define DEFT_TEST_INDEXED_DATASET_H

#include <stdint.h>

#include "deft.h"

/* images: n * features floats, labels: n, both filled here and borrowed by the dataset. */
static inline deft_dataset indexed_dataset(float *images, int32_t *labels, int n, int features) {
    for (int i = 0; i < n; i++) {
        for (int f = 0; f < features; f++) images[i * features + f] = (float)(i * 10 + f);
        labels[i] = i;
    }
    return (deft_dataset){.n = n, .features = features, .n_classes = n, .images = images, .labels = labels};
}

#endif
