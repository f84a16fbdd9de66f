/* CIFAR-10 batches: pixels normalised by the usual per-channel mean and standard deviation into f32 NCHW or NHWC,
 * with torchvision's training augmentation (RandomCrop(32, padding) then RandomHorizontalFlip) drawn from a seed and
 * (epoch, sample): the same sample of the same epoch gets the same crop and flip whichever thread or batch makes it.
 * A deft_cifar_feed is the fill callback of a deft_loader over a dataset, so this work runs on the loader's thread. */
#include <stdlib.h>
#include <string.h>

#include "batch_range.h"
#include "graph_internal.h"

#define DEFT_CIFAR_SIDE 32
#define DEFT_CIFAR_PLANE (DEFT_CIFAR_SIDE * DEFT_CIFAR_SIDE)
#define DEFT_CIFAR_MAX_PADDING 16

/* The statistics of CIFAR-10's training set (per channel, of pixels scaled to [0, 1]). */
static const float deft_cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f};
static const float deft_cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};

/* splitmix64's finaliser: every bit of the input moves every bit of the output. */
static uint64_t deft_cifar_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

deft_cifar_augmentation deft_cifar_augment_draw(const deft_cifar_options *o, int64_t epoch, int64_t sample) {
    deft_cifar_augmentation a = {0, 0, 0};
    if (!o || (o->crop_padding <= 0 && !o->flip)) return a;
    const uint64_t e = deft_cifar_mix((uint64_t)epoch * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    const uint64_t r = deft_cifar_mix(o->seed ^ e ^ deft_cifar_mix((uint64_t)sample + 0xd1b54a32d192ed03ull));
    if (o->crop_padding > 0) {
        uint64_t span = 2 * (uint64_t)o->crop_padding + 1;
        a.dy = (int)((r & 0xffff) % span) - o->crop_padding;
        a.dx = (int)(((r >> 16) & 0xffff) % span) - o->crop_padding;
    }
    if (o->flip) a.flip = (int)((r >> 40) & 1);
    return a;
}

static deft_status deft_cifar_check_options(const char *what, const deft_cifar_options *o) {
    if (o->layout != DEFT_NCHW && o->layout != DEFT_NHWC)
        return deft_set_error(DEFT_ERR_INVALID, "%s: unknown layout %d (DEFT_NCHW or DEFT_NHWC)", what, (int)o->layout);
    if (o->crop_padding < 0 || o->crop_padding > DEFT_CIFAR_MAX_PADDING)
        return deft_set_error(DEFT_ERR_INVALID, "%s: crop_padding %d is out of [0, %d]", what, o->crop_padding,
                              DEFT_CIFAR_MAX_PADDING);
    return DEFT_OK;
}

/* Output pixel (y, x) of the augmented image reads input pixel (y + dy, x + dx) of the zero-padded image, after the
 * flip mirrors x: as RandomCrop on the padded image at offset (pad + dy, pad + dx), then the flip. Padding is raw 0,
 * which normalises to -mean / std, as ToTensor and Normalize after RandomCrop give. */
static void deft_cifar_sample(const uint8_t *px, deft_cifar_augmentation a, deft_layout layout, float *out) {
    for (int c = 0; c < 3; c++) {
        const float scale = 1.0f / (255.0f * deft_cifar_std[c]), shift = deft_cifar_mean[c] / deft_cifar_std[c];
        for (int y = 0; y < DEFT_CIFAR_SIDE; y++)
            for (int x = 0; x < DEFT_CIFAR_SIDE; x++) {
                int sy = y + a.dy, sx = (a.flip ? DEFT_CIFAR_SIDE - 1 - x : x) + a.dx;
                int inside = sy >= 0 && sy < DEFT_CIFAR_SIDE && sx >= 0 && sx < DEFT_CIFAR_SIDE;
                float v = inside ? (float)px[c * DEFT_CIFAR_PLANE + sy * DEFT_CIFAR_SIDE + sx] * scale - shift : -shift;
                int pixel = y * DEFT_CIFAR_SIDE + x;
                out[layout == DEFT_NHWC ? pixel * 3 + c : c * DEFT_CIFAR_PLANE + pixel] = v;
            }
    }
}

static deft_status deft_cifar_batch_check(const deft_cifar *d, const int64_t *order, int64_t start, int64_t batch,
                                          const float *x, const int32_t *y) {
    if (!d || !d->pixels || !d->labels || !x || !y)
        return deft_set_error(DEFT_ERR_INVALID, "cifar_batch: the dataset, x and y must not be NULL");
    return deft_batch_range_check("cifar_batch", d->n, order, start, batch);
}

deft_status deft_cifar_batch(const deft_cifar *d, const int64_t *order, int64_t start, int64_t batch,
                             const deft_cifar_options *opts, int64_t epoch, float *x, int32_t *y) {
    const deft_cifar_options o = opts ? *opts : (deft_cifar_options){0};
    deft_status s = deft_cifar_check_options("cifar_batch", &o);
    if (s == DEFT_OK) s = deft_cifar_batch_check(d, order, start, batch, x, y);
    if (s != DEFT_OK) return s;
    for (int64_t i = 0; i < batch; i++) {
        int64_t k = order ? order[start + i] : start + i;
        deft_cifar_sample(d->pixels + (size_t)k * DEFT_CIFAR_IMAGE_BYTES, deft_cifar_augment_draw(&o, epoch, k),
                          o.layout, x + (size_t)i * DEFT_CIFAR_IMAGE_BYTES);
        y[i] = d->labels[k];
    }
    return DEFT_OK;
}

/* ---- the loader's fill callback ---- */

struct deft_cifar_feed {
    const deft_cifar *d;
    int64_t batch;
    deft_cifar_options o;
    int64_t *order;       /* this epoch's permutation when shuffling */
    int64_t order_epoch;  /* the epoch `order` was drawn for, -1 before the first */
};

deft_status deft_cifar_feed_new(const deft_cifar *d, int64_t batch, const deft_cifar_options *opts,
                                deft_cifar_feed **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "cifar_feed_new: out is NULL");
    *out = NULL;
    const deft_cifar_options o = opts ? *opts : (deft_cifar_options){0};
    deft_status s = deft_cifar_check_options("cifar_feed_new", &o);
    if (s != DEFT_OK) return s;
    if (!d || !d->pixels || !d->labels || d->n < 1)
        return deft_set_error(DEFT_ERR_INVALID, "cifar_feed_new: the dataset is NULL or empty");
    if (batch < 1 || batch > d->n)
        return deft_set_error(DEFT_ERR_INVALID, "cifar_feed_new: a batch of %lld from %lld samples", (long long)batch,
                              (long long)d->n);
    deft_cifar_feed *f = calloc(1, sizeof *f);
    int64_t *order = f && o.shuffle ? malloc((size_t)d->n * sizeof *order) : NULL;
    if (!f || (o.shuffle && !order)) {
        free(f);
        return deft_set_error(DEFT_ERR_OOM, "cifar_feed_new: out of host memory");
    }
    *f = (deft_cifar_feed){.d = d, .batch = batch, .o = o, .order = order, .order_epoch = -1};
    *out = f;
    return DEFT_OK;
}

int64_t deft_cifar_feed_batches(const deft_cifar_feed *f) { return f ? f->d->n / f->batch : 0; }

void deft_cifar_feed_free(deft_cifar_feed *f) {
    if (!f) return;
    free(f->order);
    free(f);
}

/* Epochs come in order on one thread, so one permutation at a time suffices. */
deft_status deft_cifar_feed_fill(void *feed, int64_t epoch, int64_t index, void *const *buffers) {
    deft_cifar_feed *f = feed;
    if (!f || !buffers) return deft_set_error(DEFT_ERR_INVALID, "cifar_feed_fill: the feed or the buffers are NULL");
    if (index < 0 || index >= deft_cifar_feed_batches(f) || epoch < 0)
        return deft_set_error(DEFT_ERR_INVALID, "cifar_feed_fill: batch %lld of epoch %lld; an epoch has %lld",
                              (long long)index, (long long)epoch, (long long)deft_cifar_feed_batches(f));
    if (f->o.shuffle && f->order_epoch != epoch) {
        deft_status s = deft_shuffle(f->order, f->d->n, f->o.seed + (uint64_t)epoch * 0x9e3779b97f4a7c15ull);
        if (s != DEFT_OK) return s;
        f->order_epoch = epoch;
    }
    return deft_cifar_batch(f->d, f->o.shuffle ? f->order : NULL, index * f->batch, f->batch, &f->o, epoch,
                            buffers[0], buffers[1]);
}

deft_status deft_loader_new_cifar(deft_cifar_feed *f, deft_tensor *x, deft_tensor *y, int depth, deft_loader **out) {
    if (!out) return deft_set_error(DEFT_ERR_INVALID, "loader_new_cifar: out is NULL");
    *out = NULL;
    if (!f || !x || !y) return deft_set_error(DEFT_ERR_INVALID, "loader_new_cifar: the feed, x or y is NULL");
    const int64_t b = f->batch, nchw[4] = {b, 3, DEFT_CIFAR_SIDE, DEFT_CIFAR_SIDE},
                  nhwc[4] = {b, DEFT_CIFAR_SIDE, DEFT_CIFAR_SIDE, 3};
    const int64_t *want = f->o.layout == DEFT_NHWC ? nhwc : nchw;
    char have[96], need[96];
    if (x->dtype != DEFT_F32 || x->ndim != 4 || memcmp(x->shape, want, sizeof nchw) != 0)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_cifar: x (%s) is %s %s; the feed makes f32 %s (%s)",
                              x->name, deft_dtype_name(x->dtype), deft_shape_str(x->ndim, x->shape, have, sizeof have),
                              deft_shape_str(4, want, need, sizeof need), f->o.layout == DEFT_NHWC ? "NHWC" : "NCHW");
    if (y->dtype != DEFT_I32 || y->ndim != 1 || y->shape[0] != b)
        return deft_set_error(DEFT_ERR_INVALID, "loader_new_cifar: y (%s) is %s %s; the feed makes i32 [%lld]", y->name,
                              deft_dtype_name(y->dtype), deft_shape_str(y->ndim, y->shape, have, sizeof have),
                              (long long)b);
    return deft_loader_new((deft_tensor *[]){x, y}, 2, deft_cifar_feed_batches(f), depth, deft_cifar_feed_fill, f, out);
}
