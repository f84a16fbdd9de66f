/* Next-token batches over token shards (deft_tokens_feed, deft_loader_new_tokens) on the CPU: in stream order
 * every row is its window of the reference stream and y is x shifted by one, across shard boundaries; shuffled,
 * an epoch's windows are a permutation of all of them, the same for the same seed and epoch and different for
 * another seed or epoch; ranks of 2, 3 and 4 take the windows r, r + world, ... of the one-rank order, disjoint and
 * covering; a loader feeds a program exactly the batches the feed makes, and its position saved and restored into a
 * new loader (also at an epoch's end, and moved back on a loader in use) gives the same batches that follow; bad
 * arguments are refused. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "token_shards.h"

#define T 8
#define B 4
#define W 96                  /* windows: divisible by B times 1, 2, 3 and 4 ranks */
#define N (W * T + 1)         /* tokens */
#define PER_EPOCH (W / B)     /* batches of one rank */

static char dir[128];
static int32_t stream[N];

/* The stream in shards of 100, 0, 333 and the rest tokens: boundaries that no window start lines up with. */
static deft_tokens *open_stream(int32_t (*token_of)(int64_t)) {
    static const int64_t sizes[] = {100, 0, 333, N - 433};
    for (int64_t i = 0; i < N; i++) stream[i] = token_of(i);
    char p[256];
    int64_t at = 0;
    for (int s = 0; s < 4; s++) {
        snprintf(p, sizeof p, "%s/part_%d.bin", dir, s);
        CHECK(shard_write(p, shard_ok(sizes[s]), stream + at, sizes[s]) == 0);
        at += sizes[s];
    }
    deft_tokens *t = NULL;
    CHECK_OK(deft_tokens_open(dir, &t));
    CHECK(deft_tokens_count(t) == N && deft_tokens_shards(t) == 4);
    return t;
}

static int32_t token_is_position(int64_t i) { return (int32_t)i; }
static int32_t token_random(int64_t i) { return (int32_t)((uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull >> 48); }

static deft_tokens_feed *feed_new(const deft_tokens *t, int shuffle, uint64_t seed, int rank, int world) {
    deft_tokens_feed *f = NULL;
    deft_tokens_options o = {.shuffle = shuffle, .seed = seed, .rank = rank, .world = world};
    CHECK_OK(deft_tokens_feed_new(t, B, T, &o, &f));
    return f;
}

/* Fills batch (epoch, index) and returns the window of each row, checking the rows against the stream: x is the
 * window's tokens, y the same one further. -1 for a row that is no window's. */
static void fill_windows(deft_tokens_feed *f, int64_t epoch, int64_t index, int64_t *windows) {
    int32_t x[B * T], y[B * T];
    CHECK_OK(deft_tokens_feed_fill(f, epoch, index, (void *[]){x, y}));
    for (int r = 0; r < B; r++) {
        int64_t w = -1;
        for (int64_t c = 0; c < W && w < 0; c++)
            if (memcmp(x + r * T, stream + c * T, T * sizeof *x) == 0) w = c;
        int y_ok = w >= 0 && memcmp(y + r * T, stream + w * T + 1, T * sizeof *y) == 0;
        CHECK_MSG(w >= 0 && y_ok, "epoch %lld batch %lld row %d: x is no window's, or y not x shifted by one",
                  (long long)epoch, (long long)index, r);
        windows[r] = w;
    }
}

/* The windows of one epoch of a rank, in the order its batches take them. */
static void epoch_windows(deft_tokens_feed *f, int64_t epoch, int64_t *out) {
    for (int64_t i = 0; i < deft_tokens_feed_batches(f); i++) fill_windows(f, epoch, i, out + i * B);
}

static void test_sequential(void) {
    deft_tokens *t = open_stream(token_random);
    deft_tokens_feed *f = feed_new(t, 0, 0, 0, 1);
    CHECK(deft_tokens_feed_batches(f) == PER_EPOCH);
    int64_t w[W];
    epoch_windows(f, 0, w);
    int ok = 1;
    for (int64_t k = 0; k < W; k++) ok &= w[k] == k;
    CHECK_MSG(ok, "sequential batches do not take the windows in stream order");
    epoch_windows(f, 3, w);   /* every epoch the same */
    for (int64_t k = 0; k < W; k++) ok &= w[k] == k;
    CHECK_MSG(ok, "a later epoch takes other windows");
    deft_tokens_feed_free(f);
    /* A stream one token short of W windows has W - 1: y of the last one would run past the end. */
    deft_tokens *t2 = NULL;
    char p[256];
    snprintf(p, sizeof p, "%s/part_3.bin", dir);
    CHECK_OK(deft_tokens_open(p, &t2));
    CHECK_OK(deft_tokens_feed_new(t2, 1, T, NULL, &f));
    CHECK(deft_tokens_feed_batches(f) == (deft_tokens_count(t2) - 1) / T);
    deft_tokens_feed_free(f);
    deft_tokens_close(t2);
    deft_tokens_close(t);
}

static int is_permutation(const int64_t *w, int n) {
    int seen[W] = {0};
    for (int k = 0; k < n; k++) {
        if (w[k] < 0 || w[k] >= W || seen[w[k]]) return 0;
        seen[w[k]] = 1;
    }
    return 1;
}

static void test_shuffle(void) {
    deft_tokens *t = open_stream(token_is_position);
    deft_tokens_feed *f = feed_new(t, 1, 1234, 0, 1), *same = feed_new(t, 1, 1234, 0, 1),
                     *other = feed_new(t, 1, 1235, 0, 1);
    int64_t a0[W], a1[W], b0[W], c0[W], a0again[W];
    epoch_windows(f, 0, a0);
    epoch_windows(f, 1, a1);
    epoch_windows(f, 0, a0again);   /* back to epoch 0 on the same feed */
    epoch_windows(same, 0, b0);
    epoch_windows(other, 0, c0);
    CHECK_MSG(is_permutation(a0, W) && is_permutation(a1, W) && is_permutation(c0, W),
              "a shuffled epoch does not take every window once");
    CHECK(memcmp(a0, b0, sizeof a0) == 0 && memcmp(a0, a0again, sizeof a0) == 0);
    CHECK(memcmp(a0, a1, sizeof a0) != 0 && memcmp(a0, c0, sizeof a0) != 0);
    int in_place = 0;
    for (int k = 0; k < W; k++) in_place += a0[k] == k;
    CHECK_MSG(in_place < W / 4, "%d of %d windows in stream order: not shuffled", in_place, W);
    deft_tokens_feed_free(f);
    deft_tokens_feed_free(same);
    deft_tokens_feed_free(other);
    deft_tokens_close(t);
}

/* Rank r of world takes windows r, r + world, ... of the one-rank order: disjoint, and together all of them. */
static void test_ranks(int shuffle) {
    deft_tokens *t = open_stream(token_is_position);
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        deft_tokens_feed *one = feed_new(t, shuffle, 99, 0, 1);
        int64_t global[W];
        epoch_windows(one, epoch, global);
        deft_tokens_feed_free(one);
        for (int world = 2; world <= 4; world++) {
            int64_t all[W];
            for (int r = 0; r < world; r++) {
                deft_tokens_feed *f = feed_new(t, shuffle, 99, r, world);
                CHECK(deft_tokens_feed_batches(f) == W / world / B);
                int64_t mine[W];
                epoch_windows(f, epoch, mine);
                int ok = 1;
                for (int64_t j = 0; j < W / world; j++) {
                    ok &= mine[j] == global[j * world + r];
                    all[j * world + r] = mine[j];
                }
                CHECK_MSG(ok, "shuffle %d epoch %lld: rank %d of %d does not take every %d-th window of the one "
                          "order", shuffle, (long long)epoch, r, world, world);
                deft_tokens_feed_free(f);
            }
            CHECK_MSG(is_permutation(all, W), "shuffle %d: %d ranks overlap or miss windows", shuffle, world);
        }
    }
    deft_tokens_close(t);
}

/* ---- the loader ---- */

/* The next `steps` batches of two loaders are the same ones, end markers included. */
static void check_same_batches(token_net *n, deft_loader *a, deft_loader *b, int steps, const char *what) {
    int ok = 1;
    for (int s = 0; s < steps; s++) {
        int32_t xa[B * T], ya[B * T], xb[B * T], yb[B * T];
        deft_loader_batch ba = token_net_next(n, a, xa, ya), bb = token_net_next(n, b, xb, yb);
        ok &= ba.epoch == bb.epoch && ba.index == bb.index && ba.end == bb.end;
        if (!ba.end) ok &= memcmp(xa, xb, sizeof xa) == 0 && memcmp(ya, yb, sizeof ya) == 0;
    }
    CHECK_MSG(ok, "%s: the loaders' batches differ", what);
}

/* What the loader feeds is what the feed makes. */
static void test_loader_values(void) {
    deft_tokens *t = open_stream(token_random);
    token_net n;
    token_net_build(&n, B, T, deft_cpu());
    deft_tokens_feed *f = feed_new(t, 1, 5, 1, 2), *ref = feed_new(t, 1, 5, 1, 2);
    deft_loader *l = NULL;
    CHECK_OK(deft_loader_new_tokens(f, n.x, n.y, 0, &l));
    int64_t e = -1, i = -1;
    deft_loader_position(l, &e, &i);
    CHECK(e == 0 && i == 0);
    int ok = 1;
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        for (int64_t k = 0; k < deft_tokens_feed_batches(f); k++) {
            int32_t x[B * T], y[B * T], rx[B * T], ry[B * T];
            deft_loader_batch b = token_net_next(&n, l, x, y);
            CHECK_OK(deft_tokens_feed_fill(ref, epoch, k, (void *[]){rx, ry}));
            ok &= b.epoch == epoch && b.index == k && !b.end;
            ok &= memcmp(x, rx, sizeof x) == 0 && memcmp(y, ry, sizeof y) == 0;
            for (int j = 0; j < B * T; j++) ok &= j % T == T - 1 || y[j] == x[j + 1];
        }
        int32_t x[B * T], y[B * T];
        ok &= token_net_next(&n, l, x, y).end == 1;
    }
    CHECK_MSG(ok, "the loader fed other batches than the feed makes");
    deft_loader_free(l);
    deft_tokens_feed_free(f);
    deft_tokens_feed_free(ref);
    deft_graph_free(n.g);
    deft_tokens_close(t);
}

/* A run stopped after `taken` batch calls and resumed in a new loader from its saved position goes on exactly as
 * the uninterrupted one. */
static void check_resume(const deft_tokens *t, token_net *n, int taken, int64_t want_e, int64_t want_i) {
    deft_tokens_feed *fa = feed_new(t, 1, 77, 0, 1), *fb = feed_new(t, 1, 77, 0, 1);
    deft_loader *a = NULL, *b = NULL;
    CHECK_OK(deft_loader_new_tokens(fa, n->x, n->y, 3, &a));
    for (int s = 0; s < taken; s++) {
        int32_t x[B * T], y[B * T];
        token_net_next(n, a, x, y);
    }
    int64_t e = -1, i = -1;
    deft_loader_position(a, &e, &i);
    CHECK_MSG(e == want_e && i == want_i, "after %d calls the position is (%lld, %lld), wanted (%lld, %lld)", taken,
              (long long)e, (long long)i, (long long)want_e, (long long)want_i);
    CHECK_OK(deft_loader_new_tokens(fb, n->x, n->y, 2, &b));
    CHECK_OK(deft_loader_seek(b, e, i));
    int64_t e2 = -1, i2 = -1;
    deft_loader_position(b, &e2, &i2);
    CHECK(e2 == e && i2 == i);
    char what[64];
    snprintf(what, sizeof what, "resumed at (%lld, %lld)", (long long)e, (long long)i);
    check_same_batches(n, a, b, 2 * PER_EPOCH + 3, what);
    deft_loader_free(a);
    deft_loader_free(b);
    deft_tokens_feed_free(fa);
    deft_tokens_feed_free(fb);
}

static void test_resume(void) {
    deft_tokens *t = open_stream(token_random);
    token_net n;
    token_net_build(&n, B, T, deft_cpu());
    check_resume(t, &n, 0, 0, 0);
    check_resume(t, &n, 5, 0, 5);
    check_resume(t, &n, PER_EPOCH, 0, PER_EPOCH);          /* the last batch taken, its end not yet reported */
    check_resume(t, &n, PER_EPOCH + 1, 1, 0);              /* the end reported */
    check_resume(t, &n, PER_EPOCH + 1 + 7, 1, 7);

    /* Moved back on a loader in use, it feeds again what it fed from there. */
    deft_tokens_feed *f = feed_new(t, 1, 3, 0, 1), *g = feed_new(t, 1, 3, 0, 1);
    deft_loader *l = NULL, *fresh = NULL;
    CHECK_OK(deft_loader_new_tokens(f, n.x, n.y, 4, &l));
    for (int s = 0; s < PER_EPOCH + 4; s++) {
        int32_t x[B * T], y[B * T];
        token_net_next(&n, l, x, y);
    }
    CHECK_OK(deft_loader_seek(l, 0, 3));
    CHECK_OK(deft_loader_new_tokens(g, n.x, n.y, 0, &fresh));
    for (int s = 0; s < 3; s++) {
        int32_t x[B * T], y[B * T];
        token_net_next(&n, fresh, x, y);
    }
    check_same_batches(&n, l, fresh, PER_EPOCH + 2, "moved back to (0, 3)");
    CHECK_ERR(deft_loader_seek(l, 0, PER_EPOCH + 1), DEFT_ERR_INVALID, "out of range; an epoch has 24 batches");
    CHECK_ERR(deft_loader_seek(l, -1, 0), DEFT_ERR_INVALID, "out of range");
    CHECK_ERR(deft_loader_seek(l, INT64_MAX / 2, 0), DEFT_ERR_INVALID, "out of range");
    CHECK_ERR(deft_loader_seek(NULL, 0, 0), DEFT_ERR_INVALID, "loader is NULL");
    deft_loader_free(l);
    deft_loader_free(fresh);
    deft_tokens_feed_free(f);
    deft_tokens_feed_free(g);
    deft_graph_free(n.g);
    deft_tokens_close(t);
}

static void test_bad_arguments(void) {
    deft_tokens *t = open_stream(token_random);
    deft_tokens_feed *f = NULL;
    deft_tokens_options o = {.rank = 2, .world = 2};
    CHECK_ERR(deft_tokens_feed_new(t, B, T, &o, &f), DEFT_ERR_INVALID, "rank 2 of a world of 2");
    o = (deft_tokens_options){.rank = -1};
    CHECK_ERR(deft_tokens_feed_new(t, B, T, &o, &f), DEFT_ERR_INVALID, "rank -1 of a world of 1");
    CHECK_ERR(deft_tokens_feed_new(t, 0, T, NULL, &f), DEFT_ERR_INVALID, "batch 0 x seq 8");
    CHECK_ERR(deft_tokens_feed_new(t, B, 0, NULL, &f), DEFT_ERR_INVALID, "batch 4 x seq 0");
    CHECK_ERR(deft_tokens_feed_new(t, INT64_MAX / 2, 4, NULL, &f), DEFT_ERR_INVALID, "the batch's bytes");
    CHECK_ERR(deft_tokens_feed_new(t, W + 1, T, NULL, &f), DEFT_ERR_INVALID,
              "769 tokens make 96 windows of 8 + 1 tokens, fewer than a batch of 97 for each of 1 ranks");
    o = (deft_tokens_options){.world = 25};
    CHECK_ERR(deft_tokens_feed_new(t, B, T, &o, &f), DEFT_ERR_INVALID, "for each of 25 ranks");
    CHECK_ERR(deft_tokens_feed_new(NULL, B, T, NULL, &f), DEFT_ERR_INVALID, "tokens are NULL");
    CHECK_ERR(deft_tokens_feed_new(t, B, T, NULL, NULL), DEFT_ERR_INVALID, "out is NULL");
    CHECK(f == NULL);
    CHECK(deft_tokens_feed_batches(NULL) == 0);

    f = feed_new(t, 0, 0, 0, 1);
    int32_t x[B * T], y[B * T];
    CHECK_ERR(deft_tokens_feed_fill(f, 0, PER_EPOCH, (void *[]){x, y}), DEFT_ERR_INVALID,
              "batch 24 of epoch 0; an epoch has 24");
    CHECK_ERR(deft_tokens_feed_fill(f, -1, 0, (void *[]){x, y}), DEFT_ERR_INVALID, "epoch -1");
    CHECK_ERR(deft_tokens_feed_fill(f, 0, 0, (void *[]){x, NULL}), DEFT_ERR_INVALID, "buffers are NULL");
    deft_graph *g = deft_graph_new();
    deft_tensor *good = deft_input(g, "x", DEFT_I32, 2, (int64_t[]){B, T}, deft_cpu());
    deft_tensor *wide = deft_input(g, "wide", DEFT_I32, 2, (int64_t[]){B, T + 1}, deft_cpu());
    deft_tensor *flt = deft_input(g, "flt", DEFT_F32, 2, (int64_t[]){B, T}, deft_cpu());
    deft_loader *l = NULL;
    CHECK_ERR(deft_loader_new_tokens(f, wide, good, 0, &l), DEFT_ERR_INVALID,
              "x (wide) is i32 [4, 9]; the feed makes i32 [4, 8]");
    CHECK_ERR(deft_loader_new_tokens(f, good, flt, 0, &l), DEFT_ERR_INVALID, "y (flt) is f32 [4, 8]");
    CHECK_ERR(deft_loader_new_tokens(NULL, good, good, 0, &l), DEFT_ERR_INVALID, "the feed, x or y is NULL");
    CHECK(l == NULL);
    deft_graph_free(g);
    deft_tokens_feed_free(f);
    deft_tokens_feed_free(NULL);
    deft_tokens_close(t);
}

int main(void) {
    CHECK(shard_dir_make(dir, sizeof dir, "test_token_loader") == 0);
    test_sequential();
    test_shuffle();
    test_ranks(0);
    test_ranks(1);
    test_loader_values();
    test_resume();
    test_bad_arguments();
    CHECK(shard_dir_remove(dir) == 0);
    return deft_check_finish();
}
