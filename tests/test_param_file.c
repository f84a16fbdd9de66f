/* Parameter files: bit-exact round trips, the byte layout the header documents, and files that must be refused
 * (truncated at every byte, corrupted, of another model) without touching the graph. */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "ref.h"

#define CPU deft_cpu()
#define MAX_PARAMS 8

/* ---- scratch files, unique per process, removed at the end ---- */
static char path_main[256], path_bad[256];

static void make_paths(void) {
    snprintf(path_main, sizeof path_main, "/tmp/deft_test_param_file_%ld.bin", (long)getpid());
    snprintf(path_bad, sizeof path_bad, "/tmp/deft_test_param_file_%ld_bad.bin", (long)getpid());
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0, got;
    do {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            buf = realloc(buf, cap);
        }
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    fclose(f);
    *n = len;
    return buf;
}

static void spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
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
    unsigned char *f1 = slurp(path_main, &n1), *f2 = slurp(path_bad, &n2);
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

/* Parses the file as the header comment describes it, with a CRC written here. */
static void test_layout(void) {
    CHECK(ref_crc32((const unsigned char *)"123456789", 9) == 0xCBF43926u);   /* the CRC-32 check value */
    model a = build(SPECS, N_SPECS, 5);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = slurp(path_main, &n), *p = f;
    CHECK(f && n >= 16 && memcmp(p, "DEFTPARM", 8) == 0);
    CHECK(le(p + 8, 4) == 1 && le(p + 12, 4) == (uint64_t)N_SPECS);
    p += 16;
    for (int i = 0; i < N_SPECS && f; i++) {
        const param_spec *s = &SPECS[i];
        size_t name_len = (size_t)le(p, 4);
        CHECK(name_len == strlen(s->name) && memcmp(p + 4, s->name, name_len) == 0);
        p += 4 + name_len;
        CHECK(le(p, 4) == (uint64_t)s->dt && le(p + 4, 4) == (uint64_t)s->ndim);
        p += 8;
        for (int d = 0; d < s->ndim; d++, p += 8) CHECK((int64_t)le(p, 8) == s->shape[d]);
        size_t bytes = (size_t)le(p, 8);
        CHECK(bytes == deft_tensor_nbytes(a.p[i]));
        p += 8;
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

/* Writes `file` to path_bad and checks that loading it fails as told and leaves m as it was. */
static void expect_refused(const model *m, const unsigned char *file, size_t n, deft_status want,
                           const char *needle, int line) {
    size_t before_n;
    unsigned char *before = snapshot(m, &before_n);
    spit(path_bad, file, n);
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
    unsigned char *f = slurp(path_main, &n);
    for (size_t cut = 0; f && cut < n; cut++) REFUSED(&b, f, cut, DEFT_ERR_IO, "truncated");
    /* Where the cut falls is named. */
    REFUSED(&b, f, 10, DEFT_ERR_IO, "the file ends in the header, after 10 bytes");
    REFUSED(&b, f, 16 + 4 + 3, DEFT_ERR_IO, "the name of record 0");
    REFUSED(&b, f, 16 + 4 + 10 + 8 + 3 * 8 + 8 + 50, DEFT_ERR_IO, "the data of parameter 'enc.weight'");
    REFUSED(&b, f, n - 2, DEFT_ERR_IO, "the checksum of parameter 'scale'");
    free(f);
    deft_graph_free(a.g);
    deft_graph_free(b.g);
}

static void test_corrupt_files(void) {
    model a = build(SPECS, N_SPECS, 8), b = build(SPECS, N_SPECS, 9);
    CHECK_OK(deft_params_save(a.g, path_main));
    size_t n;
    unsigned char *f = slurp(path_main, &n), *bad = malloc(n + 1);
    const size_t data0 = 16 + 4 + 10 + 8 + 3 * 8 + 8;   /* first byte of enc.weight's data */
    /* A flipped bit in the data, in the checksum itself, in the last parameter's data. */
    size_t flips[] = {data0, data0 + 3 * 5 * 7 * 4 - 1, data0 + 3 * 5 * 7 * 4, n - 5};
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(bad, f, n);
        bad[flips[i]] ^= 0x10;
        REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in parameter '");
    }
    memcpy(bad, f, n);
    bad[data0 + 7] ^= 1;
    REFUSED(&b, bad, n, DEFT_ERR_IO, "checksum mismatch in parameter 'enc.weight'");
    memcpy(bad, f, n);
    bad[0] = 'X';
    REFUSED(&b, bad, n, DEFT_ERR_IO, "bad magic");
    memcpy(bad, f, n);
    bad[8] = 2;
    REFUSED(&b, bad, n, DEFT_ERR_IO, "format version 2");
    memcpy(bad, f, n);
    bad[n] = 0;
    REFUSED(&b, bad, n + 1, DEFT_ERR_IO, "trailing bytes");
    memcpy(bad, f, n);
    bad[data0 - 8] += 4;   /* the data length of enc.weight */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "parameter 'enc.weight' has 424 bytes of data, its dtype and shape need 420");
    memcpy(bad, f, n);
    bad[16 + 4 + 10] = 77;   /* enc.weight's dtype code */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "dtype code 77");
    memcpy(bad, f, n);
    bad[16 + 3] = 0x40;   /* a name length of 1 GiB: refused before anything that large is allocated */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "record 0 has a name of 1073741834 bytes");
    memcpy(bad, f, n);
    bad[12] = N_SPECS + 1;   /* one record more than the file has */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "truncated: the file ends in the name of record 6");
    memcpy(bad, f, n);
    bad[12] = N_SPECS - 1;   /* one record less: its bytes are trailing */
    REFUSED(&b, bad, n, DEFT_ERR_IO, "trailing bytes after the last of its 5 records");
    REFUSED(&b, (const unsigned char *)"", 0, DEFT_ERR_IO, "truncated");
    free(bad);
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
    unsigned char *f = slurp(path_main, &n);
    size_t rec = 4 + 1 + 8 + 8 + 8 + 12 + 4;   /* one record: name "u" or "v", [3] f32 */
    CHECK(n == 16 + 2 * rec);
    unsigned char *bad = malloc(n);
    memcpy(bad, f, n);
    memcpy(bad + 16 + rec, f + 16, rec);
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
    unsigned char *f = slurp(path_main, &n);
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
    unsigned char *f = slurp(path_bad, &n);
    CHECK(n == 16 && f && le(f + 12, 4) == 0);
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
    test_repeated_record();
    test_other_models();
    test_names_and_arguments();
    test_gpu_params();
    remove(path_main);
    remove(path_bad);
    return deft_check_finish();
}
