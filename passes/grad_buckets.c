/* Data parallel gradient buckets (passes/grad_buckets.h). */
#include <stdlib.h>

#include "grad_buckets.h"

static int deft_grad_base(const deft_tensor *t) {
    while (t->is_view) t = t->src[0];
    return t->id;
}

typedef struct deft_grad_key {
    int base, param;
} deft_grad_key;

/* Ready order: by the gradient's node; one node's gradients (views of it) in reverse storage order, as the
 * backward pass reaches a model's parameters from the last one. */
static int deft_grad_key_cmp(const void *a, const void *b) {
    const deft_grad_key *x = a, *y = b;
    if (x->base != y->base) return x->base < y->base ? -1 : 1;
    return x->param > y->param ? -1 : x->param < y->param;
}

/* Gradients order[0 .. n) cut forward into buckets of at most `limit` bytes; returns the buckets made. */
static int deft_cut_forward(const deft_tensor *step, deft_grad_buckets *b, int n, size_t limit) {
    for (int j = 0; j < n; j++) {
        const size_t bytes = deft_tensor_bytes(step->src[b->order[j]]);
        if (b->n_buckets == 0 || (b->bytes[b->n_buckets - 1] + bytes > limit && j > b->first[b->n_buckets - 1])) {
            b->first[b->n_buckets] = j;
            b->bytes[b->n_buckets++] = 0;
        }
        b->bytes[b->n_buckets - 1] += bytes;
    }
    return b->n_buckets;
}

deft_status deft_grad_buckets_cut(const deft_tensor *step, const deft_config *c, deft_grad_buckets *out) {
    *out = (deft_grad_buckets){0};
    const int n = step->nsrc;
    const size_t cap = (size_t)(n ? n : 1);
    deft_grad_key *keys = malloc(cap * sizeof *keys);
    out->order = malloc(cap * sizeof *out->order);
    out->first = malloc((cap + 1) * sizeof *out->first);
    out->bytes = malloc(cap * sizeof *out->bytes);
    if (!keys || !out->order || !out->first || !out->bytes) {
        free(keys);
        deft_grad_buckets_free(out);
        return deft_set_error(DEFT_ERR_OOM, "data parallel: out of host memory cutting the gradient buckets");
    }
    for (int i = 0; i < n; i++) keys[i] = (deft_grad_key){deft_grad_base(step->src[i]), i};
    qsort(keys, (size_t)n, sizeof *keys, deft_grad_key_cmp);
    for (int j = 0; j < n; j++) out->order[j] = keys[j].param;
    free(keys);
    out->n = n;
    /* The last bucket first, from the end: at least one gradient, then while they fit. */
    const size_t last_limit = c->last_bucket_bytes;
    int last = n;
    size_t last_bytes = 0;
    while (last > 0) {
        const size_t bytes = deft_tensor_bytes(step->src[out->order[last - 1]]);
        if (last < n && last_bytes + bytes > last_limit) break;
        last_bytes += bytes;
        last--;
    }
    deft_cut_forward(step, out, last, c->bucket_bytes);
    if (last < n) {
        out->first[out->n_buckets] = last;
        out->bytes[out->n_buckets++] = last_bytes;
    }
    out->first[out->n_buckets] = n;
    return DEFT_OK;
}

void deft_grad_buckets_free(deft_grad_buckets *b) {
    free(b->order);
    free(b->first);
    free(b->bytes);
    *b = (deft_grad_buckets){0};
}
