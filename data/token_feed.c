/* Next-token batches over a token stream (data.h): windows of seq + 1 tokens every seq tokens, ordered per epoch
 * (stream order or a seeded permutation), dealt out to ranks window by window, and made into x/y rows on a
 * deft_loader's thread. Everything a batch holds follows from (seed, epoch, index, rank, world), never from what
 * came before, which is what lets deft_loader_seek resume a loader exactly. */
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "graph_internal.h"

/* The multiplier deft's other feeds step the seed by per epoch (data/loader.c, data/cifar_batch.c). */
#define DEFT_TOKENS_EPOCH_STEP 0x9e3779b97f4a7c15ull

struct deft_tokens_feed {
    const deft_tokens *t;
    int64_t batch, seq;
    int64_t windows;      /* W: windows in the stream */
    int64_t per_epoch;    /* batches of this rank per epoch */
    deft_tokens_options o;
    int64_t *order;       /* this epoch's permutation of the windows when shuffling */
    int64_t order_epoch;  /* the epoch `order` was drawn for, -1 before the first */
};

static deft_status deft_tokens_feed_check(const deft_tokens *t, int64_t batch, int64_t seq,
                                          const deft_tokens_options *o, int64_t *windows, int64_t *per_epoch) {
    if (!t) return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_new: the tokens are NULL");
    int64_t rows;
    if (batch < 1 || seq < 1 || !deft_i64_mul(batch, seq, &rows) || rows > (int64_t)(DEFT_MAX_BYTES / sizeof(int32_t)))
        return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_new: batch %lld x seq %lld (each at least 1, the batch's "
                              "bytes a size of memory)", (long long)batch, (long long)seq);
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_new: rank %d of a world of %d", o->rank, o->world);
    const int64_t count = deft_tokens_count(t);
    *windows = count > 0 ? (count - 1) / seq : 0;
    *per_epoch = *windows / o->world / batch;
    if (*per_epoch < 1)
        return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_new: %lld tokens make %lld windows of %lld + 1 tokens, "
                              "fewer than a batch of %lld for each of %d ranks", (long long)count, (long long)*windows,
                              (long long)seq, (long long)batch, o->world);
    return DEFT_OK;
}

deft_status deft_tokens_feed_new(const deft_tokens *t, int64_t batch, int64_t seq, const deft_tokens_options *opts,
                                 deft_tokens_feed **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_new: out is NULL");
    *out = NULL;
    deft_tokens_options o = opts ? *opts : (deft_tokens_options){0};
    if (o.world == 0) o.world = 1;
    int64_t windows = 0, per_epoch = 0;
    deft_status s = deft_tokens_feed_check(t, batch, seq, &o, &windows, &per_epoch);
    if (s != DEFT_OK) return s;
    size_t order_bytes = 0;
    if (o.shuffle && !deft_size_mul((size_t)windows, sizeof(int64_t), &order_bytes))
        return deft_set_error(DEFT_ERR_OOM, "tokens_feed_new: %lld windows are too many to order", (long long)windows);
    deft_tokens_feed *f = calloc(1, sizeof *f);
    int64_t *order = f && o.shuffle ? malloc(order_bytes) : NULL;
    if (!f || (o.shuffle && !order)) {
        free(f);
        return deft_set_error(DEFT_ERR_OOM, "tokens_feed_new: out of host memory for the order of %lld windows",
                              (long long)windows);
    }
    *f = (deft_tokens_feed){.t = t, .batch = batch, .seq = seq, .windows = windows, .per_epoch = per_epoch, .o = o,
                            .order = order, .order_epoch = -1};
    *out = f;
    return DEFT_OK;
}

int64_t deft_tokens_feed_batches(const deft_tokens_feed *f) { return f ? f->per_epoch : 0; }

void deft_tokens_feed_free(deft_tokens_feed *f) {
    if (!f) return;
    free(f->order);
    free(f);
}

/* Row `row` of the epoch's batch `index`: this rank's window j = index * batch + row, the (j * world + rank)-th of
 * the epoch's order. */
static int64_t deft_tokens_window(const deft_tokens_feed *f, int64_t index, int64_t row) {
    const int64_t k = (index * f->batch + row) * f->o.world + f->o.rank;
    return f->o.shuffle ? f->order[k] : k;
}

/* x's row is the window's first seq tokens; y's the same shifted by one, so only its last token is read again. */
static deft_status deft_tokens_row(const deft_tokens_feed *f, int64_t window, int32_t *x, int32_t *y) {
    const int64_t at = window * f->seq;
    deft_status s = deft_tokens_read(f->t, at, f->seq, x);
    if (s != DEFT_OK) return s;
    memcpy(y, x + 1, (size_t)(f->seq - 1) * sizeof *y);
    return deft_tokens_read(f->t, at + f->seq, 1, y + f->seq - 1);
}

/* Epochs come in order on one thread, so one permutation at a time suffices. */
deft_status deft_tokens_feed_fill(void *feed, int64_t epoch, int64_t index, void *const *buffers) {
    deft_tokens_feed *f = feed;
    if (!f || !buffers || !buffers[0] || !buffers[1])
        return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_fill: the feed or the buffers are NULL");
    if (index < 0 || index >= f->per_epoch || epoch < 0)
        return deft_set_error(DEFT_ERR_INVALID, "tokens_feed_fill: batch %lld of epoch %lld; an epoch has %lld",
                              (long long)index, (long long)epoch, (long long)f->per_epoch);
    if (f->o.shuffle && f->order_epoch != epoch) {
        deft_status s = deft_shuffle(f->order, f->windows, f->o.seed + (uint64_t)epoch * DEFT_TOKENS_EPOCH_STEP);
        if (s != DEFT_OK) return s;
        f->order_epoch = epoch;
    }
    int32_t *x = buffers[0], *y = buffers[1];
    for (int64_t row = 0; row < f->batch; row++) {
        deft_status s = deft_tokens_row(f, deft_tokens_window(f, index, row), x + row * f->seq, y + row * f->seq);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}

static deft_status deft_tokens_check_input(const deft_tokens_feed *f, const deft_tensor *t, const char *which) {
    const int64_t want[2] = {f->batch, f->seq};
    if (t->dtype == DEFT_I32 && t->ndim == 2 && memcmp(t->shape, want, sizeof want) == 0) return DEFT_OK;
    char have[96], need[96];
    return deft_set_error(DEFT_ERR_INVALID, "loader_new_tokens: %s (%s) is %s %s; the feed makes i32 %s", which,
                          t->name, deft_dtype_name(t->dtype), deft_shape_str(t->ndim, t->shape, have, sizeof have),
                          deft_shape_str(2, want, need, sizeof need));
}

deft_status deft_loader_new_tokens(deft_tokens_feed *f, deft_tensor *x, deft_tensor *y, int depth, deft_loader **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "loader_new_tokens: out is NULL");
    *out = NULL;
    if (!f || !x || !y) return deft_set_error(DEFT_ERR_INVALID, "loader_new_tokens: the feed, x or y is NULL");
    deft_status s = deft_tokens_check_input(f, x, "x");
    if (s == DEFT_OK) s = deft_tokens_check_input(f, y, "y");
    if (s != DEFT_OK) return s;
    return deft_loader_new((deft_tensor *[]){x, y}, 2, f->per_epoch, depth, deft_tokens_feed_fill, f, out);
}
