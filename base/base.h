/* The lowest layer, shared by every folder: status messages, shape arithmetic and the environment's one reader.
 * It knows no graph, device memory or kernel. Not installed. */
#ifndef DEFT_BASE_H
#define DEFT_BASE_H

#include "deft.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (base/error.c) ---- */
/* Sets the calling thread's message and returns s. */
deft_status deft_set_error(deft_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- shapes (base/shape.c) ---- */
int64_t deft_shape_numel(int ndim, const int64_t *shape);
/* Writes "[2, 3, 4]" into buf. */
const char *deft_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* Row-major contiguous strides in elements. */
void deft_shape_strides(int ndim, const int64_t *shape, int64_t *strides);
/* Numpy broadcasting of two shapes; DEFT_ERR_SHAPE (with message) if they do not broadcast. */
deft_status deft_shape_broadcast(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out);
/* Strides of `in` (ndim_in dims) seen through the output shape: 0 on broadcast dims, aligned right. */
void deft_broadcast_strides(int ndim_in, const int64_t *in_shape, int ndim_out, const int64_t *out_shape,
                            int64_t *strides);

/* The debug knobs, read from the environment once (the library's one reader of it): config.h. */

#ifdef __cplusplus
}
#endif
#endif
