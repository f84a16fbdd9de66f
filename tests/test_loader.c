/* deft_loader and deft_program_feed_async on the CPU: every batch is fed once and in order, with a loader slower
 * than the loop (it sleeps in the callback), a faster one, and one whose timing varies; errors from the callback
 * come back with its message; bad arguments are refused; the built-in dataset loader follows deft_shuffle's order.
 * On a CPU program feed_async is a plain feed, so the values the program computes show which batch it got. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "indexed_dataset.h"
#include "xorshift.h"

#define ROWS 4
#define COLS 3
#define PER_EPOCH 7
#define EPOCHS 3

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* The value of element i of x in batch (epoch, index), and its label row. */
static float x_value(int64_t epoch, int64_t index, int i) { return (float)(epoch * 1000 + index * 10 + i); }

typedef struct fill_ctx {
    long sleep_us;          /* per fill */
    int jitter;             /* 1: a random sleep of 0..2 ms instead */
    uint64_t rng;
    int64_t fail_at;        /* the sequence number whose fill fails, -1 for none */
    int fail_silently;      /* fail without a message */
    int64_t calls;
} fill_ctx;

static deft_status fill(void *vctx, int64_t epoch, int64_t index, void *const *buffers) {
    fill_ctx *c = vctx;
    int64_t seq = epoch * PER_EPOCH + index;
    c->calls++;
    if (c->jitter) sleep_us((long)(xorshift64(&c->rng) % 2000));
    else if (c->sleep_us) sleep_us(c->sleep_us);
    if (seq == c->fail_at)
        return c->fail_silently ? DEFT_ERR_IO
                                : deft_loader_error(DEFT_ERR_IO, "disk on fire at batch %lld", (long long)seq);
    float *x = buffers[0];
    int32_t *y = buffers[1];
    for (int i = 0; i < ROWS * COLS; i++) x[i] = x_value(epoch, index, i);
    for (int i = 0; i < ROWS; i++) y[i] = (int32_t)(seq * 100 + i);
    return DEFT_OK;
}

typedef struct net {
    deft_graph *g;
    deft_tensor *x, *y, *x2, *y1;
    deft_program *p;
} net;

static void net_build(net *n) {
    n->g = deft_graph_new();
    n->x = deft_input(n->g, "x", DEFT_F32, 2, (int64_t[]){ROWS, COLS}, deft_cpu());
    n->y = deft_input(n->g, "labels", DEFT_I32, 1, (int64_t[]){ROWS}, deft_cpu());
    n->x2 = deft_mul_scalar(n->x, 2.0);
    n->y1 = deft_add_scalar(n->y, 1.0);
    CHECK(n->x2 && n->y1);
    n->p = deft_compile(n->g, (deft_tensor *[]){n->x2, n->y1}, 2, NULL);
    CHECK(n->p != NULL);
}

/* Runs EPOCHS epochs through the loader, checking the order and the values the program computed from each batch;
 * `loop_us` slows the loop itself. */
static void run_epochs(net *n, deft_loader *l, long loop_us) {
    int64_t fed = 0;
    for (int64_t e = 0; e < EPOCHS; e++) {
        for (int64_t i = 0; i < PER_EPOCH; i++) {
            deft_loader_batch b;
            CHECK_OK(deft_loader_next(l, n->p, &b));
            CHECK_MSG(b.epoch == e && b.index == i && !b.end && b.fed == ++fed,
                      "got epoch %lld index %lld end %d fed %lld, wanted %lld %lld", (long long)b.epoch,
                      (long long)b.index, b.end, (long long)b.fed, (long long)e, (long long)i);
            CHECK_OK(deft_program_run(n->p));
            float x2[ROWS * COLS];
            int32_t y1[ROWS];
            CHECK_OK(deft_program_read(n->p, n->x2, x2, sizeof x2));
            CHECK_OK(deft_program_read(n->p, n->y1, y1, sizeof y1));
            int ok = 1;
            for (int k = 0; k < ROWS * COLS; k++) ok &= x2[k] == 2 * x_value(e, i, k);
            for (int k = 0; k < ROWS; k++) ok &= y1[k] == (int32_t)((e * PER_EPOCH + i) * 100 + k + 1);
            CHECK_MSG(ok, "epoch %lld batch %lld: the program saw other values", (long long)e, (long long)i);
            if (loop_us) sleep_us(loop_us);
        }
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, n->p, &b));
        CHECK_MSG(b.end == 1 && b.epoch == e && b.index == -1, "end of epoch %lld: end %d epoch %lld index %lld",
                  (long long)e, b.end, (long long)b.epoch, (long long)b.index);
    }
}

static void test_order(const char *what, long fill_us, int jitter, long loop_us, int depth) {
    fprintf(stderr, "order: %s\n", what);
    net n;
    net_build(&n);
    fill_ctx c = {.sleep_us = fill_us, .jitter = jitter, .rng = 0x1234567u, .fail_at = -1};
    deft_loader *l = NULL;
    CHECK_OK(deft_loader_new((deft_tensor *[]){n.x, n.y}, 2, PER_EPOCH, depth, fill, &c, &l));
    run_epochs(&n, l, loop_us);
    deft_loader_free(l);   /* joins the thread, which may be filling ahead */
    CHECK(c.calls >= EPOCHS * PER_EPOCH);
    deft_graph_free(n.g);
}

static void test_callback_errors(int silently) {
    net n;
    net_build(&n);
    fill_ctx c = {.fail_at = 5, .fail_silently = silently};
    deft_loader *l = NULL;
    CHECK_OK(deft_loader_new((deft_tensor *[]){n.x, n.y}, 2, PER_EPOCH, 2, fill, &c, &l));
    for (int i = 0; i < 5; i++) {
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, n.p, &b));
        CHECK(b.index == i);
    }
    for (int again = 0; again < 2; again++) {   /* the error stays */
        deft_loader_batch b = {.index = 99};
        if (silently) {
            CHECK_ERR(deft_loader_next(l, n.p, &b), DEFT_ERR_IO, "returned DEFT_ERR_IO without a message");
        } else {
            CHECK_ERR(deft_loader_next(l, n.p, &b), DEFT_ERR_IO, "disk on fire at batch 5");
            CHECK(strstr(deft_errmsg(), "filling batch 5 of epoch 0") != NULL);
        }
        CHECK(b.index == -1 && !b.end);
    }
    deft_loader_free(l);
    deft_graph_free(n.g);
}

static void test_bad_arguments(void) {
    net n;
    net_build(&n);
    fill_ctx c = {.fail_at = -1};
    deft_tensor *in[] = {n.x, n.y};
    deft_loader *l = (deft_loader *)&c;
    CHECK_ERR(deft_loader_new(in, 2, PER_EPOCH, 0, fill, &c, NULL), DEFT_ERR_INVALID, "out is NULL");
    CHECK_ERR(deft_loader_new(in, 0, PER_EPOCH, 0, fill, &c, &l), DEFT_ERR_INVALID, "0 inputs");
    CHECK(l == NULL);
    CHECK_ERR(deft_loader_new(NULL, 2, PER_EPOCH, 0, fill, &c, &l), DEFT_ERR_INVALID, "NULL");
    CHECK_ERR(deft_loader_new((deft_tensor *[]){n.x, NULL}, 2, PER_EPOCH, 0, fill, &c, &l), DEFT_ERR_INVALID,
              "input 1 is NULL");
    CHECK_ERR(deft_loader_new((deft_tensor *[]){n.x2}, 1, PER_EPOCH, 0, fill, &c, &l), DEFT_ERR_INVALID,
              "not an input");
    CHECK_ERR(deft_loader_new(in, 2, 0, 0, fill, &c, &l), DEFT_ERR_INVALID, "batches per epoch");
    CHECK_ERR(deft_loader_new(in, 2, PER_EPOCH, 1, fill, &c, &l), DEFT_ERR_INVALID, "depth 1");
    CHECK_ERR(deft_loader_new(in, 2, PER_EPOCH, 65, fill, &c, &l), DEFT_ERR_INVALID, "depth 65");
    CHECK_ERR(deft_loader_new(in, 2, PER_EPOCH, 0, NULL, &c, &l), DEFT_ERR_INVALID, "callback is NULL");
    CHECK(l == NULL);
    deft_loader_free(NULL);

    CHECK_OK(deft_loader_new(in, 2, PER_EPOCH, 0, fill, &c, &l));
    CHECK_ERR(deft_loader_next(NULL, n.p, NULL), DEFT_ERR_INVALID, "loader is NULL");
    CHECK_ERR(deft_loader_next(l, NULL, NULL), DEFT_ERR_INVALID, "program is NULL");
    /* A program of another graph: the feed refuses, and the batch is still there for the right program. */
    net other;
    net_build(&other);
    CHECK_ERR(deft_loader_next(l, other.p, NULL), DEFT_ERR_STATE, "not part of this program's graph");
    deft_loader_batch b;
    CHECK_OK(deft_loader_next(l, n.p, &b));
    CHECK(b.epoch == 0 && b.index == 0);
    deft_loader_free(l);
    deft_graph_free(other.g);

    /* feed_async checks what feed checks. */
    float host[ROWS * COLS] = {0};
    CHECK_ERR(deft_program_feed_async(NULL, n.x, host, sizeof host), DEFT_ERR_INVALID, "program is NULL");
    CHECK_ERR(deft_program_feed_async(n.p, NULL, host, sizeof host), DEFT_ERR_INVALID, "tensor is NULL");
    CHECK_ERR(deft_program_feed_async(n.p, n.x, host, 4), DEFT_ERR_INVALID, "4 bytes given for input x");
    CHECK_ERR(deft_program_feed_async(n.p, n.x, NULL, sizeof host), DEFT_ERR_INVALID, "host buffer is NULL");
    CHECK_ERR(deft_program_feed_async(n.p, n.x2, host, sizeof host), DEFT_ERR_STATE, "not an input");
    CHECK_ERR(deft_loader_error(DEFT_ERR_IO, "code %d", 7), DEFT_ERR_IO, "code 7");
    deft_graph_free(n.g);
}

/* On a CPU program feed_async takes any memory and is a plain feed; a later synchronous feed replaces it. */
static void test_feed_async_cpu(void) {
    net n;
    net_build(&n);
    float a[ROWS * COLS], b[ROWS * COLS], out[ROWS * COLS];
    int32_t y[ROWS] = {1, 2, 3, 4};
    for (int i = 0; i < ROWS * COLS; i++) a[i] = (float)i, b[i] = (float)(100 + i);
    CHECK_ERR(deft_program_run(n.p), DEFT_ERR_STATE, "never fed");
    CHECK_OK(deft_program_feed_async(n.p, n.x, a, sizeof a));
    CHECK_OK(deft_program_feed_async(n.p, n.y, y, sizeof y));
    CHECK_OK(deft_program_run(n.p));
    CHECK_OK(deft_program_read(n.p, n.x2, out, sizeof out));
    CHECK(out[0] == 0.0f && out[ROWS * COLS - 1] == 2.0f * (ROWS * COLS - 1));
    CHECK_OK(deft_program_feed_async(n.p, n.x, a, sizeof a));
    CHECK_OK(deft_program_feed(n.p, n.x, b, sizeof b));
    CHECK_OK(deft_program_run(n.p));
    CHECK_OK(deft_program_read(n.p, n.x2, out, sizeof out));
    CHECK(out[0] == 200.0f);
    deft_graph_free(n.g);
}

/* The built-in loader: consecutive batches of the dataset, or of deft_shuffle's order per epoch. */
static void test_dataset_loader(int shuffle) {
    enum { N = 10, F = 3, B = 4 };
    float images[N * F];
    int32_t labels[N];
    deft_dataset d = indexed_dataset(images, labels, N, F);
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){B, F}, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){B}, deft_cpu());
    deft_tensor *xo = deft_mul_scalar(x, 1.0), *yo = deft_add_scalar(y, 0.0);
    deft_program *p = deft_compile(g, (deft_tensor *[]){xo, yo}, 2, NULL);
    CHECK(p != NULL);
    deft_loader *l = NULL;
    CHECK_ERR(deft_loader_new_dataset(&d, y, x, shuffle, 7, 0, &l), DEFT_ERR_INVALID, "must be f32");
    CHECK_ERR(deft_loader_new_dataset(NULL, x, y, shuffle, 7, 0, &l), DEFT_ERR_INVALID, "dataset is NULL");
    CHECK_OK(deft_loader_new_dataset(&d, x, y, shuffle, 7, 0, &l));
    for (int64_t e = 0; e < 3; e++) {
        int64_t order[N];
        for (int i = 0; i < N; i++) order[i] = i;
        if (shuffle) CHECK_OK(deft_shuffle(order, N, 7 + (uint64_t)e * 0x9E3779B97F4A7C15ull));
        for (int64_t i = 0; i < N / B; i++) {
            deft_loader_batch b;
            CHECK_OK(deft_loader_next(l, p, &b));
            CHECK(b.epoch == e && b.index == i && !b.end);
            CHECK_OK(deft_program_run(p));
            float xs[B * F];
            int32_t ys[B];
            CHECK_OK(deft_program_read(p, xo, xs, sizeof xs));
            CHECK_OK(deft_program_read(p, yo, ys, sizeof ys));
            int ok = 1;
            for (int r = 0; r < B; r++) {
                int64_t s = order[i * B + r];
                ok &= ys[r] == (int32_t)s;
                for (int f = 0; f < F; f++) ok &= xs[r * F + f] == (float)(s * 10 + f);
            }
            CHECK_MSG(ok, "dataset loader (shuffle %d): epoch %lld batch %lld holds other samples", shuffle,
                      (long long)e, (long long)i);
        }
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, p, &b));
        CHECK(b.end == 1);
    }
    deft_loader_free(l);
    deft_graph_free(g);
}

int main(void) {
    test_order("fast loader, fast loop", 0, 0, 0, 0);
    test_order("slow loader (2 ms a batch)", 2000, 0, 0, 2);
    test_order("slow loop (2 ms a step), depth 4", 0, 0, 2000, 4);
    test_order("loader with random delays", 0, 1, 0, 3);
    test_callback_errors(0);
    test_callback_errors(1);
    test_bad_arguments();
    test_feed_async_cpu();
    test_dataset_loader(0);
    test_dataset_loader(1);
    return deft_check_finish();
}
