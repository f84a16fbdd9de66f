/* What data/'s own files need of a loader beyond the public API (data/loader.c). */
#ifndef DEFT_LOADER_INTERNAL_H
#define DEFT_LOADER_INTERNAL_H

#include "deft/data.h"

/* The loader's batches per epoch (the range deft_loader_seek accepts), 0 for NULL; training-state files check a
 * saved position against it before they change anything. */
int64_t deft_loader_batches_per_epoch(const deft_loader *l);

#endif
