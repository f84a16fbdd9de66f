/* Data parallel: the buckets an optimizer step's gradients are all-reduced in, a pure function of the graph and the
 * compile options, so that the optimizer's split (passes/optimizer_split.c, one piece per bucket) and the replica's
 * collectives (dist/dist_program.c) cut the same way.
 *
 * The gradients are taken in the order the backward pass produces them (their nodes' ids, which the schedule
 * follows; a weight's and a bias's gradient from one node in reverse storage order). The last ones, up to
 * last_bucket_bytes but at least one gradient, make the last bucket: its all-reduce starts when the backward pass
 * ends and nothing overlaps it, so it should be short (PyTorch DDP's small first bucket is the mirror image, as
 * DDP's buckets are cut from the other end). The others are cut in order, up to bucket_bytes each; one gradient
 * larger than that is a bucket alone. */
#ifndef DEFT_GRAD_BUCKETS_H
#define DEFT_GRAD_BUCKETS_H

#include "compile_config.h"
#include "cuda_tuning.h"

/* The default sizes, DEFT_BUCKET_DEFAULT_BYTES and DEFT_LAST_BUCKET_DEFAULT_BYTES, are cuda_tuning.h's: 8 MiB
 * rather than DDP's 25, as deft's steps are short and the mid MLP's ran faster with 8 MiB buckets on 2 and 4 GPUs
 * than with 1, 4 or 25 MiB (bench/RESULTS.md, "Fourth round", data parallel): the first all-reduce starts sooner and
 * the last one left after the backward pass is smaller. */

typedef struct deft_grad_buckets {
    int n;               /* the step's parameters */
    int *order;          /* parameter indices, in the order their gradients become ready */
    int n_buckets;
    int *first;          /* n_buckets + 1 entries: bucket b is order[first[b] .. first[b + 1]) */
    size_t *bytes;       /* per bucket */
} deft_grad_buckets;

/* Cuts the gradients of optimizer step node `step` (its sources) with the limits of c (bucket_bytes,
 * last_bucket_bytes, the defaults above already applied). */
deft_status deft_grad_buckets_cut(const deft_tensor *step, const deft_config *c, deft_grad_buckets *out);
void deft_grad_buckets_free(deft_grad_buckets *b);

#endif
