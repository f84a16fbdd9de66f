/* libFuzzer target: deft_params_load on any bytes. Every outcome must be a status; a refused file must leave the
 * graph's values as they were, and a loaded one must save and load back to the same values.
 * Seeds (--write-seeds DIR): deft_params_save of the model below and of a model with fewer parameters, an empty
 * graph's file, and the main file in version 1's layout. */
#include "fuzz_common.h"

typedef struct spec {
    const char *name;
    deft_dtype dt;
    int ndim;
    int64_t shape[4];
} spec;

/* Every dtype, a scalar and a shape of four dimensions, as in tests/test_param_file.c. */
static const spec SPECS[] = {
    {"enc.weight", DEFT_F32, 3, {3, 5, 7}}, {"enc.bias", DEFT_F64, 1, {1}}, {"dec.weight", DEFT_BF16, 4, {2, 3, 1, 5}},
    {"table", DEFT_I32, 1, {13}},          {"gate", DEFT_F16, 2, {4, 1}},  {"scale", DEFT_F32, 0, {0}},
};
#define N_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))

static deft_graph *model;
static deft_tensor *params[N_SPECS];

static deft_graph *build(int n, deft_tensor **out, uint64_t seed) {
    deft_graph *g = deft_graph_new();
    deft_graph_set_seed(g, seed);
    for (int i = 0; i < n; i++) {
        out[i] = deft_param(g, SPECS[i].name, SPECS[i].dt, SPECS[i].ndim, SPECS[i].shape, deft_cpu(),
                            DEFT_INIT_NORMAL);
        if (!out[i]) deft_fuzz_die("cannot build the model");
    }
    return g;
}

/* Every parameter's bytes, concatenated. */
static size_t snapshot(unsigned char *buf, size_t cap) {
    size_t at = 0;
    for (int i = 0; i < N_SPECS; i++) {
        size_t n = deft_tensor_nbytes(params[i]);
        if (at + n > cap || deft_param_get(params[i], buf + at, n) != DEFT_OK) deft_fuzz_die("snapshot");
        at += n;
    }
    return at;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Version 2 -> version 1: the file's and every record's header CRC dropped. */
static size_t to_version_1(const unsigned char *f, size_t n, unsigned char *out) {
    memcpy(out, f, 16);
    out[8] = 1;
    size_t at = 20, o = 16;
    for (uint64_t i = 0; i < le(f + 12, 4) && at < n; i++) {
        size_t name_len = (size_t)le(f + at, 4), ndim = (size_t)le(f + at + 4 + name_len + 4, 4);
        size_t head = 4 + name_len + 8 + 8 * ndim + 8, bytes = (size_t)le(f + at + head - 8, 8);
        memcpy(out + o, f + at, head);
        memcpy(out + o + head, f + at + head + 4, bytes + 4);
        o += head + bytes + 4;
        at += head + 4 + bytes + 4;
    }
    return o;
}

static void write_seeds(const char *dir) {
    deft_tensor *p[N_SPECS];
    deft_graph *g = build(N_SPECS, p, 7);
    const char *tmp = deft_fuzz_path("seed.params");
    if (deft_params_save(g, tmp) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    deft_fuzz_seed_file(dir, "model.params", tmp);
    static unsigned char f[8192], v1[8192];
    FILE *in = fopen(tmp, "rb");
    size_t n = in ? fread(f, 1, sizeof f, in) : 0;
    if (in) fclose(in);
    deft_fuzz_seed_bytes(dir, "model_v1.params", v1, to_version_1(f, n, v1));
    deft_graph_free(g);
    g = build(2, p, 8);
    if (deft_params_save(g, tmp) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    deft_fuzz_seed_file(dir, "two.params", tmp);
    deft_graph_free(g);
    g = deft_graph_new();
    if (deft_params_save(g, tmp) != DEFT_OK) deft_fuzz_die(deft_errmsg());
    deft_fuzz_seed_file(dir, "empty.params", tmp);
    deft_graph_free(g);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    deft_fuzz_start(argc, argv, write_seeds);
    model = build(N_SPECS, params, 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned char before[4096], after[4096];
    const char *path = deft_fuzz_path("input.params"), *again = deft_fuzz_path("again.params");
    deft_fuzz_write(path, data, size);
    size_t n = snapshot(before, sizeof before);
    deft_status s = deft_params_load(model, path);
    snapshot(after, sizeof after);
    if (!deft_fuzz_loaded(s, before, after, n)) return 0;
    /* Loaded: what it set saves and loads back bit for bit. */
    FUZZ_ASSERT(deft_params_save(model, again) == DEFT_OK);
    FUZZ_ASSERT(deft_params_load(model, again) == DEFT_OK);
    snapshot(before, sizeof before);
    FUZZ_ASSERT(memcmp(before, after, n) == 0);
    return 0;
}
