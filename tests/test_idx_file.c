/* idx files (MNIST's format): round trips of every element type, the exact big-endian bytes on disk, and every way a
 * file can be wrong, each a DEFT_ERR_IO that names the path and the problem. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"

static char path[256];

static void spit(const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static unsigned char *slurp(size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 16);
    *n = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

/* Reading `bytes` must fail with DEFT_ERR_IO, name the path and contain `needle`, and leave out empty. */
static void expect_bad(const void *bytes, size_t n, const char *needle, int line) {
    spit(bytes, n);
    deft_idx d;
    memset(&d, 0xAB, sizeof d);   /* garbage, as a caller's uninitialised struct */
    deft_status s = deft_idx_read(path, &d);
    CHECK_MSG(s == DEFT_ERR_IO, "line %d: got %s (%s)", line, deft_status_name(s), deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, deft_errmsg(),
              needle);
    CHECK_MSG(strstr(deft_errmsg(), path) != NULL, "line %d: message \"%s\" lacks the path", line, deft_errmsg());
    CHECK_MSG(d.data == NULL && d.bytes == 0 && d.ndim == 0, "line %d: out not cleared", line);
    deft_idx_free(&d);
}
#define BAD(bytes, n, needle) expect_bad(bytes, n, needle, __LINE__)

/* ---- round trips ---- */

static void fill(deft_idx *d, int type, size_t esize, int ndim, const int64_t *dims) {
    d->type = type;
    d->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)(d->dims[i] = dims[i]);
    d->bytes = n * esize;
    d->data = malloc(d->bytes ? d->bytes : 1);
}

static void round_trip(const deft_idx *in) {
    CHECK_OK(deft_idx_write(path, in));
    deft_idx out;
    CHECK_OK(deft_idx_read(path, &out));
    CHECK(out.type == in->type && out.ndim == in->ndim && out.bytes == in->bytes);
    for (int i = 0; i < in->ndim; i++) CHECK(out.dims[i] == in->dims[i]);
    CHECK(in->bytes == 0 || memcmp(out.data, in->data, in->bytes) == 0);
    deft_idx_free(&out);
    CHECK(out.data == NULL && out.bytes == 0);
}

static void test_round_trips(void) {
    deft_idx d = {0};
    fill(&d, 0x08, 1, 3, (int64_t[]){3, 5, 7});
    for (size_t i = 0; i < d.bytes; i++) ((uint8_t *)d.data)[i] = (uint8_t)(i * 37);
    round_trip(&d);
    free(d.data);

    fill(&d, 0x09, 1, 1, (int64_t[]){11});
    for (int i = 0; i < 11; i++) ((int8_t *)d.data)[i] = (int8_t)(i * 23 - 128);
    round_trip(&d);
    free(d.data);

    fill(&d, 0x0B, 2, 2, (int64_t[]){4, 9});
    for (int i = 0; i < 36; i++) ((int16_t *)d.data)[i] = (int16_t)(i * 1999 - 32768);
    round_trip(&d);
    free(d.data);

    fill(&d, 0x0C, 4, 4, (int64_t[]){2, 1, 3, 5});
    for (int i = 0; i < 30; i++) ((int32_t *)d.data)[i] = (int32_t)(i * 123456789u);
    round_trip(&d);
    free(d.data);

    fill(&d, 0x0D, 4, 2, (int64_t[]){1, 13});
    for (int i = 0; i < 13; i++) ((float *)d.data)[i] = (float)i * -0.3f + 1e-38f;
    round_trip(&d);
    free(d.data);

    fill(&d, 0x0E, 8, 8, (int64_t[]){1, 2, 1, 2, 1, 2, 1, 3});
    for (int i = 0; i < 24; i++) ((double *)d.data)[i] = 1.0 / (i + 1) - 0.25;
    round_trip(&d);
    free(d.data);

    /* An empty tensor is a valid idx file. */
    fill(&d, 0x0D, 4, 2, (int64_t[]){0, 5});
    round_trip(&d);
    free(d.data);
}

/* The bytes on disk are big-endian, and a file written elsewhere reads into host values. */
static void test_byte_order(void) {
    int32_t v[2] = {1, -2};
    deft_idx d = {.type = 0x0C, .ndim = 1, .dims = {2}, .data = v, .bytes = sizeof v};
    CHECK_OK(deft_idx_write(path, &d));
    CHECK(v[0] == 1 && v[1] == -2);   /* the caller's data is not converted in place */
    const unsigned char want[] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFE};
    size_t n;
    unsigned char *got = slurp(&n);
    CHECK(got && n == sizeof want && memcmp(got, want, n) == 0);
    free(got);

    /* MNIST's label file header, with three labels. */
    const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1};
    spit(labels, sizeof labels);
    deft_idx l;
    CHECK_OK(deft_idx_read(path, &l));
    CHECK(l.type == 8 && l.ndim == 1 && l.dims[0] == 3 && l.bytes == 3);
    CHECK(((uint8_t *)l.data)[0] == 7 && ((uint8_t *)l.data)[2] == 1);
    deft_idx_free(&l);

    /* i16 and f64 from bytes: 0x0102 = 258, -1; 1.5 is 0x3FF8000000000000. */
    const unsigned char shorts[] = {0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFF};
    spit(shorts, sizeof shorts);
    CHECK_OK(deft_idx_read(path, &l));
    CHECK(((int16_t *)l.data)[0] == 258 && ((int16_t *)l.data)[1] == -1);
    deft_idx_free(&l);
    const unsigned char dbl[] = {0, 0, 0x0E, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0x3F, 0xF8, 0, 0, 0, 0, 0, 0};
    spit(dbl, sizeof dbl);
    CHECK_OK(deft_idx_read(path, &l));
    CHECK(l.ndim == 2 && ((double *)l.data)[0] == 1.5);
    deft_idx_free(&l);

    /* Dimensions above 2^31 are u32, not negative. */
    const unsigned char big[] = {0, 0, 8, 1, 0x80, 0, 0, 0};
    spit(big, sizeof big);
    deft_idx b;
    CHECK_ERR(deft_idx_read(path, &b), DEFT_ERR_IO, "truncated: the header says 2147483648 bytes of data, the file has 0");
}

/* ---- bad files ---- */

static void test_bad_headers(void) {
    BAD("", 0, "short header: the file has 0 bytes, an idx header needs at least 4");
    BAD("\0\0\x08", 3, "short header: the file has 3 bytes");
    BAD("\x01\0\x08\x01\0\0\0\0", 8, "bad magic: the file starts 0x01 0x00");
    BAD("\0\x02\x08\x01\0\0\0\0", 8, "bad magic: the file starts 0x00 0x02");
    BAD("\0\0\x0A\x01\0\0\0\0", 8, "unknown type code 0x0a");
    BAD("\0\0\x08\x00", 4, "the header gives 0 dimensions; deft reads 1 to 8");
    BAD("\0\0\x08\x09", 4, "the header gives 9 dimensions");
    BAD("\0\0\x08\x03\0\0\0\x01\0\0", 10, "short header: 3 dimensions need 12 bytes after the magic, the file has 6");
    /* A PNG is not an idx file. */
    BAD("\x89PNG\r\n\x1a\n", 8, "bad magic");
    /* Dimensions whose product wraps around 64 bits must not become a small allocation. */
    BAD("\0\0\x0E\x03\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 16,
        "the dimensions [4294967295, 4294967295, 4294967295] overflow the size of memory");
}

static void test_bad_data_lengths(void) {
    /* f32 [2, 3]: 24 bytes of data after a 12-byte header. */
    unsigned char f[12 + 24 + 5] = {0, 0, 0x0D, 2, 0, 0, 0, 2, 0, 0, 0, 3};
    for (int i = 0; i < 24; i++) f[12 + i] = (unsigned char)i;
    size_t cuts[] = {12, 13, 16, 23, 35};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char needle[128];
        snprintf(needle, sizeof needle, "truncated: the header says 24 bytes of data, the file has %zu", cuts[i] - 12);
        BAD(f, cuts[i], needle);
    }
    for (size_t cut = 5; cut < 12; cut++) BAD(f, cut, "short header");
    BAD(f, 37, "too long: the header says 24 bytes of data, the file has 25");
    BAD(f, 41, "too long: the header says 24 bytes of data, the file has 29");
    spit(f, 36);
    deft_idx ok;
    CHECK_OK(deft_idx_read(path, &ok));
    CHECK(ok.bytes == 24);
    deft_idx_free(&ok);
}

/* A file larger than one read chunk, cut short: the message gives the real size, and a 47040000-byte header (MNIST's
 * training images) over a small file allocates no more than the file holds. */
static void test_large_files(void) {
    size_t n = 3u << 20;
    unsigned char *f = calloc(16 + n, 1);
    memcpy(f, "\0\0\x08\x03\0\0\0\x03\0\0\x04\0\0\0\x04\0", 16);   /* u8 [3, 1024, 1024] */
    for (size_t i = 0; i < n; i++) f[16 + i] = (unsigned char)(i % 251);
    spit(f, 16 + n);
    deft_idx d;
    CHECK_OK(deft_idx_read(path, &d));
    CHECK(d.bytes == n && memcmp(d.data, f + 16, n) == 0);
    deft_idx_free(&d);
    BAD(f, 16 + n - 1, "truncated: the header says 3145728 bytes of data, the file has 3145727");
    memcpy(f, "\0\0\x08\x03\0\0\xEA\x60\0\0\0\x1C\0\0\0\x1C", 16);   /* u8 [60000, 28, 28] */
    BAD(f, 16 + 1000, "truncated: the header says 47040000 bytes of data, the file has 1000");
    free(f);
}

static void test_arguments(void) {
    deft_idx d = {0};
    CHECK_ERR(deft_idx_read("/tmp/deft_no_such_dir/train-images-idx3-ubyte", &d), DEFT_ERR_IO,
              "/tmp/deft_no_such_dir/train-images-idx3-ubyte: cannot open");
    CHECK(d.data == NULL);
    CHECK_ERR(deft_idx_read(NULL, &d), DEFT_ERR_INVALID, "path is NULL");
    CHECK_ERR(deft_idx_read(path, NULL), DEFT_ERR_INVALID, "out is NULL");
    deft_idx_free(NULL);
    deft_idx_free(&d);

    uint8_t v[6] = {1, 2, 3, 4, 5, 6};
    deft_idx w = {.type = 0x08, .ndim = 2, .dims = {2, 3}, .data = v, .bytes = 6};
    CHECK_ERR(deft_idx_write(NULL, &w), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_idx_write(path, NULL), DEFT_ERR_INVALID, "must not be NULL");
    w.bytes = 5;
    CHECK_ERR(deft_idx_write(path, &w), DEFT_ERR_INVALID, "bytes is 5, the dimensions and type need 6");
    w.bytes = 6, w.type = 0x07;
    CHECK_ERR(deft_idx_write(path, &w), DEFT_ERR_INVALID, "unknown type code 0x07");
    w.type = 0x08, w.ndim = 0;
    CHECK_ERR(deft_idx_write(path, &w), DEFT_ERR_INVALID, "0 dimensions; idx files have 1 to 8");
    w.ndim = 2, w.dims[1] = -3;
    CHECK_ERR(deft_idx_write(path, &w), DEFT_ERR_INVALID, "dimension 1 is -3; idx dimensions are u32");
    w.dims[1] = 3, w.data = NULL;
    CHECK_ERR(deft_idx_write(path, &w), DEFT_ERR_INVALID, "data is NULL");
    w.data = v;
    CHECK_ERR(deft_idx_write("/tmp/deft_no_such_dir/x.idx", &w), DEFT_ERR_IO,
              "/tmp/deft_no_such_dir/x.idx: cannot open for writing");
    FILE *full = fopen("/dev/full", "wb");
    if (full) {   /* a full disk shows at a write or at the close, and is reported */
        fclose(full);
        CHECK_ERR(deft_idx_write("/dev/full", &w), DEFT_ERR_IO, "/dev/full: ");
        CHECK(strstr(deft_errmsg(), "the file is incomplete") != NULL);
    }
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/deft_test_idx_file_%ld.idx", (long)getpid());
    test_round_trips();
    test_byte_order();
    test_bad_headers();
    test_bad_data_lengths();
    test_large_files();
    test_arguments();
    remove(path);
    return deft_check_finish();
}
