/* Datasets from idx files: scaling and labels, files that do not belong together, batches in a given order with
 * their bounds, and shuffles that are deterministic, unbiased permutations. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

static char images_path[256], labels_path[256];

static void write_u8(const char *path, int ndim, const int64_t *dims, const uint8_t *data) {
    deft_idx d = {.type = 0x08, .ndim = ndim, .data = (void *)data, .bytes = 1};
    for (int i = 0; i < ndim; i++) d.bytes *= (size_t)(d.dims[i] = dims[i]);
    CHECK_OK(deft_idx_write(path, &d));
}

/* 5 images of 2 x 3 pixels: pixel j of image i is 50 * i + j (0 to 206), and label i is (3 * i) % 7. */
static uint8_t PIXELS[5 * 6], LABELS[5];

static void make_data(void) {
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 6; j++) PIXELS[6 * i + j] = (uint8_t)(50 * i + j);
        LABELS[i] = (uint8_t)((3 * i) % 7);
    }
    PIXELS[29] = 255;
    write_u8(images_path, 3, (int64_t[]){5, 2, 3}, PIXELS);
    write_u8(labels_path, 1, (int64_t[]){5}, LABELS);
}

static void test_load(void) {
    deft_dataset d;
    CHECK_OK(deft_dataset_load_idx(images_path, labels_path, &d));
    CHECK(d.n == 5 && d.features == 6);
    CHECK(d.n_classes == 7);   /* labels 0, 3, 6, 2, 5: 1 + 6 */
    for (int i = 0; i < 30; i++) CHECK(d.images[i] == (float)PIXELS[i] / 255.0f);
    CHECK(d.images[0] == 0.0f && d.images[29] == 1.0f);
    for (int i = 0; i < 5; i++) CHECK(d.labels[i] == LABELS[i]);
    deft_dataset_free(&d);
    CHECK(d.images == NULL && d.labels == NULL && d.n == 0);
    deft_dataset_free(&d);   /* twice is harmless */
    deft_dataset_free(NULL);

    /* [n, features] images are taken as they are. */
    write_u8(images_path, 2, (int64_t[]){5, 6}, PIXELS);
    CHECK_OK(deft_dataset_load_idx(images_path, labels_path, &d));
    CHECK(d.n == 5 && d.features == 6 && d.images[7] == 51.0f / 255.0f);
    deft_dataset_free(&d);
}

/* Loads that must fail with `want`, a message containing `needle`, and an empty dataset. */
static void expect_bad(deft_status want, const char *needle, int line) {
    deft_dataset d;
    memset(&d, 0xAB, sizeof d);
    deft_status s = deft_dataset_load_idx(images_path, labels_path, &d);
    CHECK_MSG(s == want, "line %d: got %s (%s)", line, deft_status_name(s), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, deft_errmsg(),
              needle);
    CHECK_MSG(d.images == NULL && d.labels == NULL && d.n == 0, "line %d: out not cleared", line);
}
#define BAD(want, needle) expect_bad(want, needle, __LINE__)

static void test_bad_pairs(void) {
    char needle[600];
    write_u8(labels_path, 1, (int64_t[]){4}, LABELS);
    snprintf(needle, sizeof needle, "%s has 5 images but %s has 4 labels", images_path, labels_path);
    BAD(DEFT_ERR_INVALID, needle);

    write_u8(labels_path, 2, (int64_t[]){5, 1}, LABELS);
    snprintf(needle, sizeof needle, "%s: labels must be u8 (type 0x08) [n]; the file has type 0x08 [5, 1]", labels_path);
    BAD(DEFT_ERR_INVALID, needle);

    write_u8(labels_path, 1, (int64_t[]){5}, LABELS);
    write_u8(images_path, 1, (int64_t[]){30}, PIXELS);
    BAD(DEFT_ERR_INVALID, "images must be u8 (type 0x08) [n, rows, cols] or [n, features]; the file has type 0x08 [30]");

    float f[6] = {0};
    deft_idx fi = {.type = 0x0D, .ndim = 2, .dims = {1, 6}, .data = f, .bytes = sizeof f};
    CHECK_OK(deft_idx_write(images_path, &fi));
    BAD(DEFT_ERR_INVALID, "the file has type 0x0d [1, 6]");

    write_u8(images_path, 3, (int64_t[]){0, 2, 3}, PIXELS);
    BAD(DEFT_ERR_INVALID, "are empty");

    /* Errors of the files themselves come through with their path. */
    FILE *f2 = fopen(images_path, "wb");
    fwrite("\0\0\x08\x03\0\0\0\x05\0\0\0\x02\0\0\0\x03\x01\x02", 1, 18, f2);
    fclose(f2);
    snprintf(needle, sizeof needle, "%s: truncated: the header says 30 bytes of data, the file has 2", images_path);
    BAD(DEFT_ERR_IO, needle);
    remove(labels_path);
    write_u8(images_path, 3, (int64_t[]){5, 2, 3}, PIXELS);
    snprintf(needle, sizeof needle, "%s: cannot open", labels_path);
    BAD(DEFT_ERR_IO, needle);

    deft_dataset d;
    CHECK_ERR(deft_dataset_load_idx(NULL, labels_path, &d), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_dataset_load_idx(images_path, labels_path, NULL), DEFT_ERR_INVALID, "out is NULL");
    make_data();
}

static void test_batches(void) {
    deft_dataset d;
    CHECK_OK(deft_dataset_load_idx(images_path, labels_path, &d));
    float x[3 * 6];
    int32_t y[3];
    CHECK_OK(deft_dataset_batch(&d, NULL, 1, 3, x, y));
    for (int i = 0; i < 3; i++) {
        CHECK(y[i] == LABELS[1 + i]);
        for (int j = 0; j < 6; j++) CHECK(x[6 * i + j] == d.images[6 * (1 + i) + j]);
    }
    const int64_t order[5] = {4, 0, 3, 1, 2};
    CHECK_OK(deft_dataset_batch(&d, order, 2, 3, x, y));
    for (int i = 0; i < 3; i++) {
        int64_t k = order[2 + i];
        CHECK(y[i] == LABELS[k]);
        for (int j = 0; j < 6; j++) CHECK(x[6 * i + j] == (float)PIXELS[6 * k + j] / 255.0f);
    }
    CHECK_OK(deft_dataset_batch(&d, order, 0, 5, (float[30]){0}, (int32_t[5]){0}));

    /* Out of bounds: refused before anything is written. */
    float keep_x[3 * 6];
    int32_t keep_y[3];
    memcpy(keep_x, x, sizeof x);
    memcpy(keep_y, y, sizeof y);
    CHECK_ERR(deft_dataset_batch(&d, NULL, 3, 3, x, y), DEFT_ERR_INVALID, "samples [3, 3 + 3) are out of the dataset's [0, 5)");
    CHECK_ERR(deft_dataset_batch(&d, NULL, -1, 2, x, y), DEFT_ERR_INVALID, "out of the dataset's [0, 5)");
    CHECK_ERR(deft_dataset_batch(&d, NULL, 0, 0, x, y), DEFT_ERR_INVALID, "batch must be >= 1");
    CHECK_ERR(deft_dataset_batch(&d, NULL, 2, INT64_MAX, x, y), DEFT_ERR_INVALID, "out of the dataset");
    const int64_t bad_order[5] = {0, 1, 5, 2, 3};
    CHECK_ERR(deft_dataset_batch(&d, bad_order, 0, 3, x, y), DEFT_ERR_INVALID, "order[2] is 5, out of [0, 5)");
    const int64_t neg_order[5] = {0, 1, 2, -1, 3};
    CHECK_ERR(deft_dataset_batch(&d, neg_order, 1, 3, x, y), DEFT_ERR_INVALID, "order[3] is -1");
    CHECK_OK(deft_dataset_batch(&d, bad_order, 3, 2, x, y));   /* only the entries used are checked */
    memcpy(x, keep_x, sizeof x);
    memcpy(y, keep_y, sizeof y);
    CHECK_ERR(deft_dataset_batch(&d, bad_order, 0, 3, x, y), DEFT_ERR_INVALID, "order[2]");
    CHECK(memcmp(x, keep_x, sizeof x) == 0 && memcmp(y, keep_y, sizeof y) == 0);
    CHECK_ERR(deft_dataset_batch(NULL, NULL, 0, 1, x, y), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_dataset_batch(&d, NULL, 0, 1, NULL, y), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_dataset_batch(&d, NULL, 0, 1, x, NULL), DEFT_ERR_INVALID, "must not be NULL");
    deft_dataset_free(&d);
}

static int is_permutation(const int64_t *order, int64_t n) {
    char *seen = calloc((size_t)n + 1, 1);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = order[i] >= 0 && order[i] < n && !seen[order[i]];
        if (ok) seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_shuffle(void) {
    const int64_t sizes[] = {1, 2, 3, 10, 1000, 60000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        int64_t *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        for (uint64_t seed = 0; seed < 4; seed++) {
            deft_shuffle(a, n, seed);
            CHECK_MSG(is_permutation(a, n), "n %lld seed %llu", (long long)n, (unsigned long long)seed);
            deft_shuffle(b, n, seed);
            CHECK(memcmp(a, b, (size_t)n * sizeof *a) == 0);   /* the same seed, the same order */
        }
        if (n >= 10) {
            deft_shuffle(b, n, 12345);
            CHECK(memcmp(a, b, (size_t)n * sizeof *a) != 0);   /* another seed, another order */
            int64_t fixed = 0;
            for (int64_t i = 0; i < n; i++) fixed += a[i] == i;
            CHECK(fixed < n / 2 + 1);   /* it really moved things */
        }
        free(a);
        free(b);
    }
    CHECK_ERR(deft_shuffle(NULL, 5, 1), DEFT_ERR_INVALID, "order is NULL for 5 entries");
    int64_t none[1] = {42};
    CHECK_ERR(deft_shuffle(none, -1, 1), DEFT_ERR_INVALID, "n is -1");
    CHECK_OK(deft_shuffle(none, 0, 1));
    CHECK_OK(deft_shuffle(NULL, 0, 1));
    CHECK(none[0] == 42);
}

/* Over 6000 seeds each of the 6 orders of 3 comes up about 1000 times, and over 10000 seeds each of 10 elements
 * lands first about 1000 times: a biased draw (a plain modulo, or an off-by-one in Fisher-Yates) would show. */
static void test_shuffle_uniform(void) {
    int counts[3][3][3] = {{{0}}};
    for (uint64_t seed = 0; seed < 6000; seed++) {
        int64_t o[3];
        deft_shuffle(o, 3, seed * 0x9e3779b97f4a7c15ull);
        counts[o[0]][o[1]][o[2]]++;
    }
    const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int p = 0; p < 6; p++) {
        int c = counts[perms[p][0]][perms[p][1]][perms[p][2]];
        CHECK_MSG(c > 850 && c < 1150, "order %d%d%d came %d times in 6000", perms[p][0], perms[p][1], perms[p][2],
                  c);
    }
    int first[10] = {0};
    for (uint64_t seed = 0; seed < 10000; seed++) {
        int64_t o[10];
        deft_shuffle(o, 10, seed);
        first[o[0]]++;
    }
    for (int k = 0; k < 10; k++) CHECK_MSG(first[k] > 850 && first[k] < 1150, "%d first %d times", k, first[k]);
}

int main(void) {
    long pid = (long)getpid();
    snprintf(images_path, sizeof images_path, "/tmp/deft_test_dataset_%ld-images-idx3-ubyte", pid);
    snprintf(labels_path, sizeof labels_path, "/tmp/deft_test_dataset_%ld-labels-idx1-ubyte", pid);
    make_data();
    test_load();
    make_data();
    test_bad_pairs();
    test_batches();
    test_shuffle();
    test_shuffle_uniform();
    remove(images_path);
    remove(labels_path);
    return deft_check_finish();
}
