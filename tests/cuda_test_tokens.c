/* The token loader on a GPU: batches made on the loader's thread into pinned buffers and fed asynchronously reach a
 * program on cuda:0 exactly as deft_tokens_feed_fill makes them (x and y i32 [B, T], y one token further), over
 * three shuffled epochs with buffers recycled (depth 2); a loader moved with deft_loader_seek right after a step was
 * queued (its copy possibly still in flight) and a new loader resumed from a saved position feed the same batches
 * that follow as an uninterrupted one. Skips (77) where no GPU works; DEFT_TEST_GPU_AS_CPU=1 runs it with the CPU
 * standing in for cuda:0. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "deft_testing.h"
#include "token_shards.h"

#define T 16
#define B 8
#define N 5000

static char dir[128];
static deft_device dev;

static deft_tokens_feed *feed_new(const deft_tokens *t) {
    deft_tokens_feed *f = NULL;
    deft_tokens_options o = {.shuffle = 1, .seed = 2024};
    CHECK_OK(deft_tokens_feed_new(t, B, T, &o, &f));
    return f;
}

/* Three epochs from the loader equal the feed's batches made on this thread. */
static void test_values(const deft_tokens *t, token_net *n) {
    deft_tokens_feed *f = feed_new(t), *ref = feed_new(t);
    deft_loader *l = NULL;
    CHECK_OK(deft_loader_new_tokens(f, n->x, n->y, 2, &l));
    int ok = 1;
    for (int64_t e = 0; e < 3; e++) {
        for (int64_t i = 0; i < deft_tokens_feed_batches(f); i++) {
            int32_t x[B * T], y[B * T], rx[B * T], ry[B * T];
            deft_loader_batch b = token_net_next(n, l, x, y);
            CHECK_OK(deft_tokens_feed_fill(ref, e, i, (void *[]){rx, ry}));
            ok &= b.epoch == e && b.index == i && memcmp(x, rx, sizeof x) == 0 && memcmp(y, ry, sizeof y) == 0;
        }
        int32_t x[B * T], y[B * T];
        ok &= token_net_next(n, l, x, y).end == 1;
    }
    CHECK_MSG(ok, "the GPU program saw other batches than the feed makes");
    deft_loader_free(l);
    deft_tokens_feed_free(f);
    deft_tokens_feed_free(ref);
}

static void test_seek(const deft_tokens *t, token_net *n) {
    const int64_t per_epoch = (N - 1) / T / B;
    deft_tokens_feed *fa = feed_new(t), *fb = feed_new(t), *fc = feed_new(t);
    deft_loader *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(deft_loader_new_tokens(fa, n->x, n->y, 2, &a));
    CHECK_OK(deft_loader_new_tokens(fb, n->x, n->y, 3, &b));
    CHECK_OK(deft_loader_new_tokens(fc, n->x, n->y, 0, &c));
    int32_t x[B * T], y[B * T], x2[B * T], y2[B * T];
    for (int64_t s = 0; s < per_epoch + 5; s++) token_net_next(n, a, x, y);
    for (int64_t s = 0; s < 9; s++) token_net_next(n, b, x, y);
    /* b's last batch queued with no host wait after it: its copy may still be in flight when b moves. */
    CHECK_OK(deft_loader_next(b, n->p, NULL));
    CHECK_OK(deft_program_run(n->p));
    int64_t e = -1, i = -1;
    deft_loader_position(a, &e, &i);
    CHECK(e == 1 && i == 4);
    CHECK_OK(deft_loader_seek(b, e, i));
    CHECK_OK(deft_loader_seek(c, e, i));
    int ok = 1;
    for (int64_t s = 0; s < per_epoch + 3; s++) {
        deft_loader_batch ba = token_net_next(n, a, x, y), bb = token_net_next(n, b, x2, y2);
        ok &= ba.epoch == bb.epoch && ba.index == bb.index && ba.end == bb.end;
        ok &= ba.end || (memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0);
        deft_loader_batch bc = token_net_next(n, c, x2, y2);
        ok &= ba.epoch == bc.epoch && ba.index == bc.index && ba.end == bc.end;
        ok &= ba.end || (memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0);
    }
    CHECK_MSG(ok, "after the seek the loaders feed other batches");
    deft_loader_free(a);
    deft_loader_free(b);
    deft_loader_free(c);
    deft_tokens_feed_free(fa);
    deft_tokens_feed_free(fb);
    deft_tokens_feed_free(fc);
}

int main(void) {
    if (!deft_test_gpu(&dev)) return DEFT_CHECK_SKIP;
    CHECK(shard_dir_make(dir, sizeof dir, "cuda_test_tokens") == 0);
    static int32_t stream[N];
    shard_random_tokens(stream, N, 11);
    char p[256];
    snprintf(p, sizeof p, "%s/a.bin", dir);
    CHECK(shard_write(p, shard_ok(1234), stream, 1234) == 0);
    snprintf(p, sizeof p, "%s/b.bin", dir);
    CHECK(shard_write(p, shard_ok(N - 1234), stream + 1234, N - 1234) == 0);
    deft_tokens *t = NULL;
    CHECK_OK(deft_tokens_open(dir, &t));
    CHECK(deft_tokens_count(t) == N);
    token_net n;
    token_net_build(&n, B, T, dev);
    if (n.p) {
        test_values(t, &n);
        test_seek(t, &n);
    }
    deft_graph_free(n.g);
    deft_tokens_close(t);
    CHECK_OK(deft_pinned_check());
    CHECK(shard_dir_remove(dir) == 0);
    return deft_check_finish();
}
