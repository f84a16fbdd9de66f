/* CIFAR-10 binary files and batches: small fake files read back record by record; truncated, empty, over-long and
 * mislabelled files and missing ones are DEFT_ERR_IO naming the path and the problem; the normalised values in NCHW
 * and NHWC; the crop and flip equal to torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip computed here
 * from the drawn offsets, deterministic in (seed, epoch, sample) and covering every offset; a loader over the feed
 * gives the program exactly the batches deft_cifar_batch makes for the shuffled order. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkdir */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define REC 3073
static char dir[128];

static uint8_t pixel_of(int record, int k) { return (uint8_t)((record * 131 + k * 7) % 256); }

/* A file of `n` records whose labels are (first + r) % 10, or `bad_label` for record bad_at. */
static void write_file(const char *name, int first, int n, int bad_at, int bad_label, long cut) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (!f) return;
    long written = 0;
    for (int r = 0; r < n; r++) {
        unsigned char rec[REC];
        rec[0] = (unsigned char)(r == bad_at ? bad_label : (first + r) % 10);
        for (int k = 0; k < 3072; k++) rec[1 + k] = pixel_of(first + r, k);
        long keep = cut >= 0 && written + REC > cut ? cut - written : REC;
        if (keep > 0) CHECK(fwrite(rec, 1, (size_t)keep, f) == (size_t)keep);
        written += keep > 0 ? keep : 0;
    }
    CHECK(fclose(f) == 0);
}

static void test_read_values(void) {
    for (int i = 1; i <= 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "data_batch_%d.bin", i);
        write_file(name, (i - 1) * 3, 3, -1, 0, -1);
    }
    write_file("test_batch.bin", 100, 4, -1, 0, -1);
    deft_cifar tr, te;
    CHECK_OK(deft_cifar_load(dir, 1, &tr));
    CHECK_OK(deft_cifar_load(dir, 0, &te));
    CHECK(tr.n == 15 && te.n == 4);
    int ok = 1;
    for (int r = 0; r < tr.n; r++) {
        ok &= tr.labels[r] == r % 10;
        for (int k = 0; k < 3072; k += 101) ok &= tr.pixels[(size_t)r * 3072 + k] == pixel_of(r, k);
    }
    for (int r = 0; r < te.n; r++)
        ok &= te.labels[r] == (100 + r) % 10 && te.pixels[r * 3072 + 3071] == pixel_of(100 + r, 3071);
    CHECK_MSG(ok, "records read back with other labels or pixels");
    deft_cifar_free(&tr);
    deft_cifar_free(&te);
    CHECK(tr.pixels == NULL && tr.n == 0);
}

static void expect_bad(const char *name, const char *needle, int line) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    deft_cifar d;
    memset(&d, 0xAB, sizeof d);
    deft_status s = deft_cifar_read((const char *[]){p}, 1, &d);
    CHECK_MSG(s == DEFT_ERR_IO, "line %d: got %s (%s)", line, deft_status_name(s), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, deft_errmsg(),
              needle);
    CHECK_MSG(strstr(deft_errmsg(), p) != NULL, "line %d: message \"%s\" lacks the path", line, deft_errmsg());
    CHECK_MSG(d.pixels == NULL && d.labels == NULL && d.n == 0, "line %d: out not cleared", line);
}

static void test_bad_files(void) {
    write_file("cut.bin", 0, 3, -1, 0, 2 * REC + 100);
    expect_bad("cut.bin", "truncated or not a CIFAR-10 binary file: 6246 bytes are 2 whole records of 3073 bytes "
               "(1 label byte + 3072 pixel bytes) and 100 bytes more", __LINE__);
    write_file("short.bin", 0, 1, -1, 0, 3072);
    expect_bad("short.bin", "3072 bytes are 0 whole records", __LINE__);
    write_file("empty.bin", 0, 0, -1, 0, -1);
    expect_bad("empty.bin", "the file is empty", __LINE__);
    write_file("label.bin", 0, 4, 2, 10, -1);
    expect_bad("label.bin", "record 2 (byte offset 6146) has label 10; CIFAR-10 labels are 0 to 9", __LINE__);
    write_file("label255.bin", 0, 1, 0, 255, -1);
    expect_bad("label255.bin", "has label 255", __LINE__);
    expect_bad("missing.bin", "cannot open", __LINE__);

    /* The second of two files is bad: nothing is kept. */
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/data_batch_1.bin", dir);
    snprintf(b, sizeof b, "%s/cut.bin", dir);
    deft_cifar d;
    CHECK_ERR(deft_cifar_read((const char *[]){a, b}, 2, &d), DEFT_ERR_IO, "cut.bin: truncated");
    CHECK(d.n == 0 && d.pixels == NULL);
    CHECK_ERR(deft_cifar_read(NULL, 1, &d), DEFT_ERR_INVALID, "1 paths given");
    CHECK_ERR(deft_cifar_read((const char *[]){a}, 0, &d), DEFT_ERR_INVALID, "0 paths given");
    CHECK_ERR(deft_cifar_read((const char *[]){a}, 1, NULL), DEFT_ERR_INVALID, "out is NULL");
    CHECK_ERR(deft_cifar_load("/nonexistent-deft-dir", 0, &d), DEFT_ERR_IO, "/nonexistent-deft-dir/test_batch.bin");
    CHECK_ERR(deft_cifar_load("/nonexistent-deft-dir", 1, &d), DEFT_ERR_IO, "/nonexistent-deft-dir/data_batch_1.bin");
}

/* A directory too long for the path the loader builds is refused, never cut: with the last bytes cut off,
 * "<dir>/test_batch.bin" would become "<dir>/test_ba", a file that exists here. Slashes pad the directory (a run of
 * them names the same directory), so the path that just fits loads. */
static void test_long_dir(void) {
    const size_t room = 4095;   /* the longest path the library builds (PATH_MAX with its NUL) */
    char *longdir = malloc(room + 1);
    write_file("test_ba", 205, 1, -1, 0, -1);
    size_t len = room - strlen("/test_ba");
    snprintf(longdir, room + 1, "%s", dir);
    for (size_t i = strlen(dir); i < len; i++) longdir[i] = '/';
    longdir[len] = '\0';
    deft_cifar d;
    CHECK_ERR(deft_cifar_load(longdir, 0, &d), DEFT_ERR_INVALID, "cifar_load: path too long");
    CHECK(strstr(deft_errmsg(), dir) != NULL && d.n == 0 && d.pixels == NULL);
    CHECK_ERR(deft_cifar_load(longdir, 1, &d), DEFT_ERR_INVALID, "path too long");
    /* The longest directory whose test_batch.bin fits loads that file. */
    longdir[room - strlen("/test_batch.bin")] = '\0';
    CHECK_OK(deft_cifar_load(longdir, 0, &d));
    CHECK(d.n == 4 && d.labels[0] == 0);   /* test_batch.bin's 4 records, not test_ba's one (label 5) */
    deft_cifar_free(&d);
    free(longdir);
}

static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, stdv[3] = {0.2470f, 0.2435f, 0.2616f};

static float expected(const deft_cifar *d, int64_t k, int c, int y, int x, deft_cifar_augmentation a) {
    int sy = y + a.dy, sx = (a.flip ? 31 - x : x) + a.dx;
    double p = sy >= 0 && sy < 32 && sx >= 0 && sx < 32 ? d->pixels[(size_t)k * 3072 + c * 1024 + sy * 32 + sx] : 0;
    return (float)((p / 255.0 - mean[c]) / stdv[c]);
}

/* Every value of a batch against the formula, in either layout. */
static int batch_matches(const deft_cifar *d, const int64_t *order, int64_t start, int64_t batch,
                         const deft_cifar_options *o, int64_t epoch, const float *x, const int32_t *y) {
    int ok = 1;
    for (int64_t i = 0; i < batch; i++) {
        int64_t k = order ? order[start + i] : start + i;
        deft_cifar_augmentation a = deft_cifar_augment_draw(o, epoch, k);
        ok &= y[i] == d->labels[k];
        for (int c = 0; c < 3; c++)
            for (int yy = 0; yy < 32; yy++)
                for (int xx = 0; xx < 32; xx++) {
                    size_t pix = (size_t)(yy * 32 + xx);
                    size_t at = o->layout == DEFT_NHWC ? pix * 3 + c : (size_t)c * 1024 + pix;
                    ok &= fabsf(x[i * 3072 + at] - expected(d, k, c, yy, xx, a)) <= 1e-5f;
                }
    }
    return ok;
}

static void test_normalise(deft_cifar *d) {
    float *x = malloc(sizeof(float) * 3 * 3072);
    int32_t y[3];
    deft_cifar_options o = {0};
    CHECK_OK(deft_cifar_batch(d, NULL, 2, 3, NULL, 0, x, y));
    CHECK(batch_matches(d, NULL, 2, 3, &o, 0, x, y));
    /* One value by hand: record 2, channel 1, pixel (0, 5) of the NCHW batch's first image. */
    CHECK_NEAR(x[1024 + 5], (pixel_of(2, 1024 + 5) / 255.0 - 0.4822) / 0.2435, 1e-5);
    o.layout = DEFT_NHWC;
    CHECK_OK(deft_cifar_batch(d, NULL, 2, 3, &o, 0, x, y));
    CHECK(batch_matches(d, NULL, 2, 3, &o, 0, x, y));
    CHECK_NEAR(x[5 * 3 + 1], (pixel_of(2, 1024 + 5) / 255.0 - 0.4822) / 0.2435, 1e-5);
    CHECK(y[0] == 2 && y[2] == 4);

    CHECK_ERR(deft_cifar_batch(d, NULL, 14, 2, NULL, 0, x, y), DEFT_ERR_INVALID, "samples [14, 14 + 2)");
    CHECK_ERR(deft_cifar_batch(d, (int64_t[]){0, 99}, 0, 2, NULL, 0, x, y), DEFT_ERR_INVALID, "order[1] is 99");
    CHECK_ERR(deft_cifar_batch(d, NULL, 0, 1, &(deft_cifar_options){.crop_padding = 17}, 0, x, y), DEFT_ERR_INVALID,
              "crop_padding 17 is out of [0, 16]");
    CHECK_ERR(deft_cifar_batch(d, NULL, 0, 1, &(deft_cifar_options){.layout = 7}, 0, x, y), DEFT_ERR_INVALID,
              "unknown layout 7");
    CHECK_ERR(deft_cifar_batch(NULL, NULL, 0, 1, NULL, 0, x, y), DEFT_ERR_INVALID, "must not be NULL");
    free(x);
}

static void test_augment(deft_cifar *d) {
    deft_cifar_options o = {.crop_padding = 4, .flip = 1, .seed = 42};
    int seen[9][9] = {{0}}, flips = 0, changed = 0;
    const int draws = 4000;
    for (int s = 0; s < draws; s++) {
        deft_cifar_augmentation a = deft_cifar_augment_draw(&o, 3, s), b = deft_cifar_augment_draw(&o, 3, s);
        deft_cifar_augmentation e = deft_cifar_augment_draw(&o, 4, s);
        CHECK_MSG(a.dy == b.dy && a.dx == b.dx && a.flip == b.flip, "sample %d drew twice differently", s);
        CHECK_MSG(a.dy >= -4 && a.dy <= 4 && a.dx >= -4 && a.dx <= 4, "offset (%d, %d)", a.dy, a.dx);
        if (a.dy >= -4 && a.dy <= 4 && a.dx >= -4 && a.dx <= 4) seen[a.dy + 4][a.dx + 4]++;
        flips += a.flip;
        changed += a.dy != e.dy || a.dx != e.dx || a.flip != e.flip;
    }
    int every = 1;
    for (int i = 0; i < 9; i++)
        for (int j = 0; j < 9; j++) every &= seen[i][j] > draws / 81 / 3;   /* each offset about 1/81 of the time */
    CHECK_MSG(every, "some crop offset was (almost) never drawn");
    CHECK_MSG(flips > draws * 45 / 100 && flips < draws * 55 / 100, "%d flips in %d draws", flips, draws);
    CHECK_MSG(changed > draws * 9 / 10, "only %d of %d samples changed from epoch 3 to 4", changed, draws);
    deft_cifar_options other = o;
    other.seed = 43;
    int differ = 0;
    for (int s = 0; s < 100; s++) {
        deft_cifar_augmentation a = deft_cifar_augment_draw(&o, 0, s), b = deft_cifar_augment_draw(&other, 0, s);
        differ += a.dy != b.dy || a.dx != b.dx || a.flip != b.flip;
    }
    CHECK_MSG(differ > 80, "another seed changed only %d of 100 draws", differ);
    deft_cifar_augmentation none = deft_cifar_augment_draw(&(deft_cifar_options){0}, 5, 5);
    CHECK(none.dy == 0 && none.dx == 0 && none.flip == 0);

    /* Batches with augmentation: every value against the formula, in both layouts; the same call twice gives the
     * same bytes; a sample at the border shows the padding's value. */
    float *x = malloc(sizeof(float) * 15 * 3072), *x2 = malloc(sizeof(float) * 15 * 3072);
    int32_t y[15];
    for (int layout = 0; layout < 2; layout++) {
        o.layout = layout ? DEFT_NHWC : DEFT_NCHW;
        CHECK_OK(deft_cifar_batch(d, NULL, 0, 15, &o, 7, x, y));
        CHECK(batch_matches(d, NULL, 0, 15, &o, 7, x, y));
        CHECK_OK(deft_cifar_batch(d, NULL, 0, 15, &o, 7, x2, y));
        CHECK(memcmp(x, x2, sizeof(float) * 15 * 3072) == 0);
    }
    o.layout = DEFT_NCHW;
    int64_t k = 0;
    deft_cifar_augmentation a = deft_cifar_augment_draw(&o, 7, k);
    for (; k < 15 && a.dy <= 0; k++) a = deft_cifar_augment_draw(&o, 7, k + 1);   /* one shifted down */
    if (k < 15) {
        CHECK_OK(deft_cifar_batch(d, NULL, k, 1, &o, 7, x, y));
        CHECK_NEAR(x[31 * 32], -0.4914 / 0.2470, 1e-5);   /* its last row reads the zero padding */
    }
    free(x);
    free(x2);
}

/* A loader over a shuffled, augmenting feed into a CPU program that doubles x: every batch the program sees is the
 * one deft_cifar_batch makes for that epoch's deft_shuffle order. */
static void test_loader(deft_cifar *d) {
    enum { B = 4 };
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 4, (int64_t[]){B, 32, 32, 3}, deft_cpu());
    deft_tensor *y = deft_input(g, "y", DEFT_I32, 1, (int64_t[]){B}, deft_cpu());
    deft_tensor *x2 = deft_mul_scalar(x, 2.0), *y1 = deft_add_scalar(y, 0.0);
    deft_program *p = deft_compile(g, (deft_tensor *[]){x2, y1}, 2, NULL);
    CHECK(p != NULL);
    deft_cifar_options o = {.layout = DEFT_NHWC, .crop_padding = 4, .flip = 1, .shuffle = 1, .seed = 9};
    deft_cifar_feed *f = NULL;
    CHECK_OK(deft_cifar_feed_new(d, B, &o, &f));
    CHECK(deft_cifar_feed_batches(f) == 15 / B);
    deft_loader *l = NULL;
    CHECK_ERR(deft_loader_new_cifar(f, y, y, 0, &l), DEFT_ERR_INVALID, "the feed makes f32 [4, 32, 32, 3] (NHWC)");
    CHECK_ERR(deft_loader_new_cifar(f, x, x, 0, &l), DEFT_ERR_INVALID, "the feed makes i32 [4]");
    CHECK_OK(deft_loader_new_cifar(f, x, y, 2, &l));
    float *got = malloc(sizeof(float) * B * 3072), *want = malloc(sizeof(float) * B * 3072);
    int64_t order[15];
    int32_t gy[B], wy[B];
    for (int64_t e = 0; e < 3; e++) {
        CHECK_OK(deft_shuffle(order, 15, 9 + (uint64_t)e * 0x9e3779b97f4a7c15ull));
        for (int64_t i = 0; i < 15 / B; i++) {
            deft_loader_batch b;
            CHECK_OK(deft_loader_next(l, p, &b));
            CHECK(b.epoch == e && b.index == i);
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, x2, got, sizeof(float) * B * 3072));
            CHECK_OK(deft_program_read(p, y1, gy, sizeof gy));
            CHECK_OK(deft_cifar_batch(d, order, i * B, B, &o, e, want, wy));
            int ok = memcmp(gy, wy, sizeof gy) == 0;
            for (int k = 0; k < B * 3072; k++) ok &= got[k] == 2.0f * want[k];
            CHECK_MSG(ok, "epoch %lld batch %lld differs from deft_cifar_batch", (long long)e, (long long)i);
        }
        deft_loader_batch b;
        CHECK_OK(deft_loader_next(l, p, &b));
        CHECK(b.end);
    }
    deft_loader_free(l);
    CHECK_ERR(deft_cifar_feed_fill(f, 0, 3, (void *[]){got, gy}), DEFT_ERR_INVALID,
              "batch 3 of epoch 0; an epoch has 3");
    deft_cifar_feed_free(f);
    CHECK_ERR(deft_cifar_feed_new(d, 16, &o, &f), DEFT_ERR_INVALID, "a batch of 16 from 15 samples");
    CHECK(f == NULL);
    CHECK_ERR(deft_cifar_feed_new(NULL, 4, &o, &f), DEFT_ERR_INVALID, "NULL or empty");
    free(got);
    free(want);
    deft_graph_free(g);
}

int main(void) {
    snprintf(dir, sizeof dir, "test_cifar_%d", (int)getpid());
    CHECK(mkdir(dir, 0755) == 0);
    test_read_values();
    test_bad_files();
    test_long_dir();
    deft_cifar d;
    CHECK_OK(deft_cifar_load(dir, 1, &d));
    test_normalise(&d);
    test_augment(&d);
    test_loader(&d);
    deft_cifar_free(&d);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return deft_check_finish();
}
