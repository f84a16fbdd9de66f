/* Parameter files: bit-exact round trips, the byte layout the header documents, and files that must be refused
 * (truncated at every byte, corrupted, of another model) without touching the graph. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "read_file.h"
#include "ref.h"

#define CPU deft_cpu()
#define MAX_PARAMS 8

/* ---- scratch files, unique per process, removed at the end ---- */
static char path_main[256], path_bad[256];

static void make_paths(void) {
    snprintf(path_main, sizeof path_main, "/tmp/deft_test_param_file_%ld.bin", (long)getpid());
    snprintf(path_bad, sizeof path_bad, "/tmp/deft_test_param_file_%ld_bad.bin", (long)getpid());
}

/* ---- a reference CRC-32, bit by bit, independent of the library's table ---- */
static uint32_t ref_crc32(const unsigned char *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- a model: parameters of several dtypes and awkward shapes ---- */
typedef struct model {
    deft_graph *g;
    deft_tensor *p[MAX_PARAMS];
    int n;
} model;

typedef struct param_spec {
    const char *name;
    deft_dtype dt;
    int ndim;
    int64_t shape[4];
} param_spec;

static const param_spec SPECS[] = {
    {"enc.weight", DEFT_F32, 3, {3, 5, 7}},
    {"enc.bias", DEFT_F64, 1, {1}},
    {"dec.weight", DEFT_BF16, 4, {2, 3, 1, 5}},
    {"table", DEFT_I32, 1, {13}},
    {"gate", DEFT_F16, 2, {4, 1}},
    {"scale", DEFT_F32, 0, {0}},
};
#define N_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))

/* Builds SPECS, with `change` (if not NULL) replacing the spec of the same index `at`. Values are random bytes
 * (NaN payloads, denormals, negative zeros and all), so that only a bit-exact path round-trips them. */
static model build(const param_spec *specs, int n, uint64_t seed) {
    model m = {deft_graph_new(), {0}, n};
    for (int i = 0; i < n; i++) {
        const param_spec *s = &specs[i];
        m.p[i] = deft_param(m.g, s->name, s->dt, s->ndim, s->shape, CPU, DEFT_INIT_NORMAL);
        CHECK(m.p[i] != NULL);
        size_t bytes = deft_tensor_nbytes(m.p[i]);
        unsigned char *v = malloc(bytes);
        uint64_t st = seed * 1000 + (uint64_t)i;
        for (size_t b = 0; b < bytes; b++) v[b] = (unsigned char)ref_next(&st);
        CHECK_OK(deft_param_set(m.p[i], v, bytes));
        free(v);
    }
    return m;
}

/* Every parameter's bytes, concatenated, to compare models before and after. */
static unsigned char *snapshot(const model *m, size_t *total) {
    size_t n = 0;
    for (int i = 0; i < m->n; i++) n += deft_tensor_nbytes(m->p[i]);
    unsigned char *buf = malloc(n), *at = buf;
    for (int i = 0; i < m->n; i++) {
        CHECK_OK(deft_param_get(m->p[i], at, deft_tensor_nbytes(m->p[i])));
        at += deft_tensor_nbytes(m->p[i]);
    }
    *total = n;
    return buf;
}

static int same_values(const model *a, const model *b) {
    size_t na, nb;
    unsigned char *sa = snapshot(a, &na), *sb = snapshot(b, &nb);
    int same = na == nb && memcmp(sa, sb, na) == 0;
    free(sa);
    free(sb);
    return same;
}

static int unchanged(const model *m, const unsigned char *before, size_t n) {
    size_t now_n;
    unsigned char *now = snapshot(m, &now_n);
    int same = now_n == n && memcmp(now, before, n) == 0;
    free(now);
    return same;
}

/* ---- tests ---- */

static void test_round_trip(void) {
    model a = build(SPECS, N_SPECS, 1), b = build(SPECS, N_SPECS, 2);
    CHECK(!same_values(&a, &b));
    CHECK_OK(deft_params_save(a.g, path_main));
    CHECK_OK(deft_params_load(b.g, path_main));
    CHECK(same_values(&a, &b));
    /* A second save of the loaded model is the same file, byte for byte. */
    CHECK_OK(deft_params_save(b.g, path_bad));
    size_t n1, n2;
    unsigned char *f1 = read_file_bytes(path_main, &n1), *f2 = read_file_bytes(path_bad, &n2);
    CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0);
    free(f1);
    free(f2);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* The loaded values are what the graph computes with afterwards. */
static void test_loaded_values_are_used(void) {
    model a = build(SPECS, N_SPECS, 3), b = build(SPECS, N_SPECS, 4);
    float scale_a;
    CHECK_OK(deft_param_get(a.p[5], &scale_a, sizeof scale_a));
    scale_a = 2.5f;
    CHECK_OK(deft_param_set(a.p[5], &scale_a, sizeof scale_a));
    CHECK_OK(deft_params_save(a.g, path_main));
    deft_tensor *twice = deft_mul_scalar(b.p[5], 2.0);
    float got = 0;
    CHECK_OK(deft_realize(twice, &got, sizeof got));
    CHECK(got != 5.0f);
    CHECK_OK(deft_params_load(b.g, path_main));
    CHECK_OK(deft_realize(twice, &got, sizeof got));
    CHECK(got == 5.0f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* Version 2's layout: the file's header (20 bytes: magic, version, count, its CRC), then per record its header (name
 * length, name, dtype, ndim, dims, data bytes) and that header's CRC, then the data and the data's CRC. */
#define FILE_HEAD 20
#define REC_HEAD(name_len, ndim) (4 + (size_t)(name_len) + 8 + 8 * (size_t)(ndim) + 8)
/* The first byte of enc.weight's data (the first record: a name of 10 bytes, 3 dims). */
#define DATA0 (FILE_HEAD + REC_HEAD(10, 3) + 4)

/* Parses the file as the header comment describes it, with CRCs computed here. */
static void test_layout(void) {
    CHECK(ref_crc32((const unsigned char *)"123456789", 9) == 0xCBF43926u);   /* the CRC-32 check value */
    model a = build(SPECS, N_SPECS, 5);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = read_file_bytes(path_main, &n), *p = f;
    CHECK(f && n >= FILE_HEAD && memcmp(p, "DEFTPARM", 8) == 0);
    CHECK(le(p + 8, 4) == 2 && le(p + 12, 4) == (uint64_t)N_SPECS && le(p + 16, 4) == ref_crc32(p, 16));
    p += FILE_HEAD;
    for (int i = 0; i < N_SPECS && f; i++) {
        const param_spec *s = &SPECS[i];
        unsigned char *head = p;
        size_t name_len = (size_t)le(p, 4);
        CHECK(name_len == strlen(s->name) && memcmp(p + 4, s->name, name_len) == 0);
        p += 4 + name_len;
        CHECK(le(p, 4) == (uint64_t)s->dt && le(p + 4, 4) == (uint64_t)s->ndim);
        p += 8;
        for (int d = 0; d < s->ndim; d++, p += 8) CHECK((int64_t)le(p, 8) == s->shape[d]);
        size_t bytes = (size_t)le(p, 8);
        CHECK(bytes == deft_tensor_nbytes(a.p[i]));
        p += 8;
        CHECK((size_t)(p - head) == REC_HEAD(name_len, s->ndim) && le(p, 4) == ref_crc32(head, (size_t)(p - head)));
        p += 4;
        unsigned char *want = malloc(bytes);
        CHECK_OK(deft_param_get(a.p[i], want, bytes));
        CHECK(memcmp(p, want, bytes) == 0);   /* this host is little-endian: the data is its memory */
        free(want);
        CHECK(le(p + bytes, 4) == ref_crc32(p, bytes));
        p += bytes + 4;
    }
    CHECK(f && (size_t)(p - f) == n);   /* nothing after the last record */
    free(f);
    deft_graph_free(a.g);
}

/* The file in version 1's layout (no CRC over the file's or the records' headers), made from a version 2 file. */
static unsigned char *to_version_1(const unsigned char *f, size_t n, size_t *out_n) {
    unsigned char *v1 = malloc(n), *q = v1;
    const unsigned char *p = f + FILE_HEAD;
    memcpy(q, f, 16);
    q[8] = 1;
    q += 16;
    for (uint64_t i = 0; i < le(f + 12, 4); i++) {
        size_t head = REC_HEAD(le(p, 4), le(p + 4 + le(p, 4) + 4, 4));
        size_t bytes = (size_t)le(p + head - 8, 8);
        memcpy(q, p, head);
        memcpy(q + head, p + head + 4, bytes + 4);
        q += head + bytes + 4;
        p += head + 4 + bytes + 4;
    }
    CHECK((size_t)(p - f) == n);
    *out_n = (size_t)(q - v1);
    return v1;
}

/* Writes `file` to path_bad and checks that loading it fails as told and leaves m as it was. */
static void expect_refused(const model *m, const unsigned char *file, size_t n, deft_status want,
                           const char *needle, int line) {
    size_t before_n;
    unsigned char *before = snapshot(m, &before_n);
    write_file_bytes(path_bad, file, n);
    deft_status s = deft_params_load(m->g, path_bad);
    CHECK_MSG(s == want, "line %d: got %s, wanted %s (%s)", line, deft_status_name(s), deft_status_name(want),
              deft_errmsg());
    CHECK_MSG(strstr(deft_errmsg(), needle) != NULL, "line %d: message \"%s\" lacks \"%s\"", line, deft_errmsg(),
              needle);
    CHECK_MSG(strstr(deft_errmsg(), path_bad) != NULL, "line %d: message \"%s\" lacks the path", line,
              deft_errmsg());
    CHECK_MSG(unchanged(m, before, before_n), "line %d: the graph changed", line);
    free(before);
}
#define REFUSED(m, file, n, want, needle) expect_refused(m, file, n, want, needle, __LINE__)

static void test_truncated_everywhere(void) {
    model a = build(SPECS, N_SPECS, 6), b = build(SPECS, N_SPECS, 7);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = read_file_bytes(path_main, &n);
    for (size_t cut = 0; f && cut < n; cut++) REFUSED(&b, f, cut, DEFT_ERR_IO, "truncated");
    /* Where the cut falls is named. */
    REFUSED(&b, f, 10, DEFT_ERR_IO, "the file ends in the header, after 10 bytes");
    REFUSED(&b, f, 18, DEFT_ERR_IO, "the file ends in the header, after 18 bytes");
    REFUSED(&b, f, FILE_HEAD + 4 + 3, DEFT_ERR_IO, "the name of record 0");
    REFUSED(&b, f, FILE_HEAD + 4 + 10 + 5, DEFT_ERR_IO, "the header of record 0");
    REFUSED(&b, f, DATA0 - 2, DEFT_ERR_IO, "the header of record 0");
    REFUSED(&b, f, DATA0 + 50, DEFT_ERR_IO, "the data of parameter 'enc.weight'");
    REFUSED(&b, f, n - 2, DEFT_ERR_IO, "the checksum of parameter 'scale'");
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* Sets the CRC of the file's header and of record 0's header (enc.weight's) to match their bytes, so that the
 * checks behind the CRCs can be reached. */
static void fix_head_crcs(unsigned char *f) {
    const size_t rec0 = FILE_HEAD, head0 = REC_HEAD(10, 3);
    uint32_t c = ref_crc32(f, 16), r = ref_crc32(f + rec0, head0);
    for (int i = 0; i < 4; i++) {
        f[16 + i] = (unsigned char)(c >> (8 * i));
        f[rec0 + head0 + i] = (unsigned char)(r >> (8 * i));
    }
}

static void test_corrupt_files(void) {
    model a = build(SPECS, N_SPECS, 8), b = build(SPECS, N_SPECS, 9);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = read_file_bytes(path_main, &n), *bad = malloc(n + 1);
    /* A flipped bit in the data, in the checksum itself, in the last parameter's data. */
    size_t flips[] = {DATA0, DATA0 + 3 * 5 * 7 * 4 - 1, DATA0 + 3 * 5 * 7 * 4, n - 5};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(bad, f, n);
        bad[flips[i]] ^= 0x10;
        REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in parameter '");
    }
    memcpy(bad, f, n);
    bad[DATA0 + 7] ^= 1;
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in parameter 'enc.weight'");
    memcpy(bad, f, n);
    bad[0] = 'X';
    REFUSED(&b, bad, n, DEFT_ERR_IO, "bad magic");
    memcpy(bad, f, n);
    bad[8] = 3;
    REFUSED(&b, bad, n, DEFT_ERR_IO, "format version 3; this build reads versions 1 and 2");
    memcpy(bad, f, n);
    bad[n] = 0;
    REFUSED(&b, bad, n + 1, DEFT_ERR_IO, "trailing bytes");
    /* Headers: a changed byte fails its header's CRC, before anything is read from it. */
    memcpy(bad, f, n);
    bad[12] = N_SPECS + 1;
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in the file's header");
    memcpy(bad, f, n);
    bad[FILE_HEAD + 4] = 'E';   /* enc.weight -> Enc.weight: a name of no parameter, but corruption first */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in the header of record 0");
    memcpy(bad, f, n);
    bad[FILE_HEAD + 4 + 10 + 8] = 4;   /* enc.weight [4, 5, 7] */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in the header of record 0");
    memcpy(bad, f, n);
    bad[DATA0 - 1] ^= 0x40;   /* the header's CRC itself */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in the header of record 0");
    /* Behind matching CRCs (a writer's bug, not a flipped bit), the fields are still checked. */
    memcpy(bad, f, n);
    bad[DATA0 - 12] += 4;   /* the data length of enc.weight */
    fix_head_crcs(bad);
    REFUSED(&b, bad, n, DEFT_ERR_IO, "parameter 'enc.weight' has 424 bytes of data, its dtype and shape need 420");
    memcpy(bad, f, n);
    bad[FILE_HEAD + 4 + 10] = 77;   /* enc.weight's dtype code */
    fix_head_crcs(bad);
    REFUSED(&b, bad, n, DEFT_ERR_IO, "dtype code 77");
    memcpy(bad, f, n);
    bad[FILE_HEAD + 3] = 0x40;   /* a name length of 1 GiB: refused before anything that large is allocated */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "record 0 has a name of 1073741834 bytes");
    memcpy(bad, f, n);
    bad[FILE_HEAD + 4 + 10 + 4] = 9;   /* 9 dimensions: refused before they are read */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "9 dimensions; the file is corrupt");
    memcpy(bad, f, n);
    bad[12] = N_SPECS + 1;   /* one record more than the file has */
    fix_head_crcs(bad);
    REFUSED(&b, bad, n, DEFT_ERR_IO, "truncated: the file ends in the name of record 6");
    memcpy(bad, f, n);
    bad[12] = N_SPECS - 1;   /* one record less: its bytes are trailing */
    fix_head_crcs(bad);
    REFUSED(&b, bad, n, DEFT_ERR_IO, "trailing bytes after the last of its 5 records");
    REFUSED(&b, (const unsigned char *)"", 0, DEFT_ERR_IO, "truncated");
    free(bad);
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* Issue 26: a corrupt byte anywhere, headers included (names, dtypes, ndim, dims), is DEFT_ERR_IO, "corrupt" or
 * "truncated", never DEFT_ERR_INVALID ("of another model"). Every byte, each of three ways. */
static void test_every_byte_corrupted(void) {
    model a = build(SPECS, N_SPECS, 23), b = build(SPECS, N_SPECS, 24);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n, before_n;
    unsigned char *f = read_file_bytes(path_main, &n), *bad = malloc(n), *before = snapshot(&b, &before_n);
    static const unsigned char masks[] = {0x01, 0x80, 0xFF};
    int wrong = 0;
    for (size_t at = 0; f && at < n; at++)
        for (size_t m = 0; m < sizeof masks; m++) {
            memcpy(bad, f, n);
            bad[at] ^= masks[m];
            write_file_bytes(path_bad, bad, n);
            deft_status s = deft_params_load(b.g, path_bad);
            int ok = s == DEFT_ERR_IO && (strstr(deft_errmsg(), "corrupt") || strstr(deft_errmsg(), "truncated") ||
                                          strstr(deft_errmsg(), "bad magic") || strstr(deft_errmsg(), "version"));
            if (!ok && wrong++ < 5)
                fprintf(stderr, "byte %zu ^ 0x%02x: %s: %s\n", at, masks[m], deft_status_name(s), deft_errmsg());
        }
    CHECK_MSG(wrong == 0, "%d of %zu corrupted files were not refused as corrupt", wrong, 3 * n);
    CHECK(unchanged(&b, before, before_n));
    free(before);
    free(bad);
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* Files of version 1 (no CRC over the headers) still load, their data checked by its CRC. */
static void test_version_1(void) {
    model a = build(SPECS, N_SPECS, 25), b = build(SPECS, N_SPECS, 26);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n, n1;
    unsigned char *f = read_file_bytes(path_main, &n), *v1 = to_version_1(f, n, &n1);
    CHECK(n1 == n - 4 - 4 * N_SPECS && le(v1 + 8, 4) == 1);
    write_file_bytes(path_bad, v1, n1);
    CHECK_OK(deft_params_load(b.g, path_bad));
    CHECK(same_values(&a, &b));
    const size_t data0 = 16 + REC_HEAD(10, 3);
    v1[data0 + 5] ^= 0x20;
    REFUSED(&b, v1, n1, DEFT_ERR_IO, "checksum mismatch in parameter 'enc.weight'");
    v1[data0 + 5] ^= 0x20;
    REFUSED(&b, v1, n1 - 3, DEFT_ERR_IO, "truncated");
    v1[16 + 4 + 10] = 77;
    REFUSED(&b, v1, n1, DEFT_ERR_IO, "dtype code 77");
    free(v1);
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

/* A record repeated in place of another: a well-formed but corrupt file. */
static void test_repeated_record(void) {
    static const param_spec two[] = {{"u", DEFT_F32, 1, {3}}, {"v", DEFT_F32, 1, {3}}};
    model a = build(two, 2, 10), b = build(two, 2, 11);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = read_file_bytes(path_main, &n);
    size_t rec = REC_HEAD(1, 1) + 4 + 12 + 4;   /* one record: name "u" or "v", [3] f32 */
    CHECK(n == FILE_HEAD + 2 * rec);
    unsigned char *bad = malloc(n);
    memcpy(bad, f, n);
    memcpy(bad + FILE_HEAD + rec, f + FILE_HEAD, rec);
    REFUSED(&b, bad, n, DEFT_ERR_IO, "parameter 'u' appears twice");
    free(bad);
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

static void test_other_models(void) {
    model a = build(SPECS, N_SPECS, 12);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = read_file_bytes(path_main, &n);
    param_spec specs[N_SPECS + 1];

    memcpy(specs, SPECS, sizeof SPECS);
    specs[0].shape[0] = 7, specs[0].shape[2] = 3;   /* enc.weight [7, 5, 3] */
    model m = build(specs, N_SPECS, 13);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "parameter 'enc.weight' is [3, 5, 7] in the file but [7, 5, 3] in the graph");
    deft_graph_free(m.g);

    memcpy(specs, SPECS, sizeof SPECS);
    specs[2].ndim = 3;   /* dec.weight [2, 3, 1] */
    m = build(specs, N_SPECS, 14);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "parameter 'dec.weight' is [2, 3, 1, 5] in the file but [2, 3, 1] in the graph");
    deft_graph_free(m.g);

    memcpy(specs, SPECS, sizeof SPECS);
    specs[2].dt = DEFT_F16;
    m = build(specs, N_SPECS, 15);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "parameter 'dec.weight' is bf16 in the file but f16 in the graph");
    deft_graph_free(m.g);

    memcpy(specs, SPECS, sizeof SPECS);
    specs[3].name = "lookup";
    m = build(specs, N_SPECS, 16);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "the graph has no parameter 'table'");
    deft_graph_free(m.g);

    memcpy(specs, SPECS, sizeof SPECS);
    specs[N_SPECS] = (param_spec){"extra", DEFT_F32, 2, {2, 2}};
    m = build(specs, N_SPECS + 1, 17);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "the file has no parameter 'extra' (f32 [2, 2])");
    deft_graph_free(m.g);

    /* Fewer parameters in the graph: the file's extra one is unknown. */
    m = build(SPECS, N_SPECS - 1, 18);
    REFUSED(&m, f, n, DEFT_ERR_INVALID, "the graph has no parameter 'scale'");
    deft_graph_free(m.g);

    /* The same parameters built in another order load by name. */
    param_spec reversed[N_SPECS];
    for (int i = 0; i < N_SPECS; i++) reversed[i] = SPECS[N_SPECS - 1 - i];
    m = build(reversed, N_SPECS, 19);
    CHECK_OK(deft_params_load(m.g, path_main));
    for (int i = 0; i < N_SPECS; i++) {
        size_t bytes = deft_tensor_nbytes(a.p[i]);
        unsigned char *x = malloc(bytes), *y = malloc(bytes);
        CHECK_OK(deft_param_get(a.p[i], x, bytes));
        CHECK_OK(deft_param_get(m.p[N_SPECS - 1 - i], y, bytes));
        CHECK(memcmp(x, y, bytes) == 0);
        free(x);
        free(y);
    }
    deft_graph_free(m.g);
    free(f);
    deft_graph_free(a.g);
}

static void test_names_and_arguments(void) {
    static const param_spec dup[] = {{"dup", DEFT_F32, 1, {2}}, {"ok", DEFT_F32, 1, {2}}, {"dup", DEFT_F32, 1, {3}}};
    model m = build(dup, 3, 20);
    remove(path_bad);
    CHECK_ERR(deft_params_save(m.g, path_bad), DEFT_ERR_INVALID, "two parameters are named 'dup'");
    FILE *created = fopen(path_bad, "rb");
    CHECK(created == NULL);   /* refused before the file was created */
    if (created) fclose(created);
    CHECK_ERR(deft_params_load(m.g, path_main), DEFT_ERR_INVALID, "two parameters are named 'dup'");
    deft_graph_free(m.g);

    model e = build(SPECS, 1, 21);
    deft_set_name(e.p[0], "");
    CHECK_ERR(deft_params_save(e.g, path_bad), DEFT_ERR_INVALID, "has an empty name");
    deft_graph_free(e.g);

    model a = build(SPECS, N_SPECS, 22);
    CHECK_ERR(deft_params_save(NULL, path_main), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_params_save(a.g, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_params_load(NULL, path_main), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_params_load(a.g, NULL), DEFT_ERR_INVALID, "must not be NULL");
    CHECK_ERR(deft_params_load(a.g, "/tmp/deft_no_such_dir/params.bin"), DEFT_ERR_IO,
              "/tmp/deft_no_such_dir/params.bin: cannot open");
    CHECK_ERR(deft_params_save(a.g, "/tmp/deft_no_such_dir/params.bin"), DEFT_ERR_IO,
              "/tmp/deft_no_such_dir/params.bin: cannot open for writing");
    FILE *full = fopen("/dev/full", "wb");
    if (full) {   /* a disk that is full: the failure shows at a write or at the close, and is reported */
        fclose(full);
        CHECK_ERR(deft_params_save(a.g, "/dev/full"), DEFT_ERR_IO, "/dev/full: ");
        CHECK(strstr(deft_errmsg(), "the file is incomplete") != NULL);
    }
    /* A graph without parameters saves an empty file that loads back. */
    deft_graph *empty = deft_graph_new();
    CHECK_OK(deft_params_save(empty, path_bad));
    size_t n;
    unsigned char *f = read_file_bytes(path_bad, &n);
    CHECK(n == FILE_HEAD && f && le(f + 12, 4) == 0);
    CHECK_OK(deft_params_load(empty, path_bad));
    REFUSED(&a, f, n, DEFT_ERR_INVALID, "the file has no parameter 'enc.weight'");
    free(f);
    deft_graph_free(empty);
    deft_graph_free(a.g);
}

/* On a GPU, a parameter's live value is on the device once a program has run: save and load must use it. */
static void test_gpu_params(void) {
    if (deft_cuda_device_count() == 0) return;
    deft_graph *g = deft_graph_new();
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){3, 4}, deft_cuda(0), DEFT_INIT_NORMAL);
    deft_tensor *y = deft_mul_scalar(w, 3.0);
    deft_program *p = deft_compile(g, &y, 1, NULL);
    CHECK(p != NULL);
    CHECK_OK(deft_program_run(p));
    float v[12], back[12], out[12];
    for (int i = 0; i < 12; i++) v[i] = (float)i - 5.5f;
    CHECK_OK(deft_param_set(w, v, sizeof v));
    CHECK_OK(deft_params_save(g, path_main));
    float zero[12] = {0};
    CHECK_OK(deft_param_set(w, zero, sizeof zero));
    CHECK_OK(deft_params_load(g, path_main));
    CHECK_OK(deft_param_get(w, back, sizeof back));
    CHECK(memcmp(v, back, sizeof v) == 0);
    CHECK_OK(deft_program_run(p));
    CHECK_OK(deft_program_read(p, y, out, sizeof out));
    for (int i = 0; i < 12; i++) CHECK(out[i] == 3.0f * v[i]);
    deft_graph_free(g);
}

int main(void) {
    make_paths();
    test_round_trip();
    test_loaded_values_are_used();
    test_layout();
    test_truncated_everywhere();
    test_corrupt_files();
    test_every_byte_corrupted();
    test_version_1();
    test_repeated_record();
    test_other_models();
    test_names_and_arguments();
    test_gpu_params();
    remove(path_main);
    remove(path_bad);
    return deft_check_finish();
}
