/* The GPT-2 reference check (tests/reference/gpt2_reference.py wrote the file, in float64 through PyTorch): the
 * model of examples/gpt2.h with the file's weights, one batch's logits, loss and every gradient, then 10 AdamW steps
 * (decay on 2-D weights only) and their losses, each within a stated tolerance. Shared by test_gpt2_reference (CPU)
 * and cuda_test_gpt2_reference (GPU, f32 and bf16 autocast). */
#ifndef DEFT_TEST_GPT2_REF_H
#define DEFT_TEST_GPT2_REF_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "../examples/gpt2.h"

#define REF_PATH DEFT_TEST_DATA_DIR "/gpt2_reference.bin"
#define REF_MAX_ENTRIES 256

typedef struct ref_entry {
    char name[96];
    int is_int, ndim;
    int64_t dims[8], numel;
    void *data;         /* the values, copied out of the file: names of any length leave them unaligned there */
} ref_entry;

typedef struct ref_file {
    unsigned char *bytes;
    size_t size;
    ref_entry e[REF_MAX_ENTRIES];
    int n;
} ref_file;

/* Reads `n` bytes at *at, or fails (0) when the file is shorter. */
static int ref_take(const ref_file *r, size_t *at, void *out, size_t n) {
    if (n > r->size - *at) return 0;
    memcpy(out, r->bytes + *at, n);
    *at += n;
    return 1;
}

static int ref_parse_entry(ref_file *r, size_t *at, ref_entry *e) {
    int32_t len = 0, dt = 0, nd = 0;
    if (!ref_take(r, at, &len, 4) || len <= 0 || len >= (int32_t)sizeof e->name) return 0;
    if (!ref_take(r, at, e->name, (size_t)len)) return 0;
    e->name[len] = 0;
    if (!ref_take(r, at, &dt, 4) || !ref_take(r, at, &nd, 4) || dt < 0 || dt > 1 || nd < 0 || nd > 8) return 0;
    e->is_int = dt;
    e->ndim = nd;
    e->numel = 1;
    for (int d = 0; d < nd; d++) {
        if (!ref_take(r, at, &e->dims[d], 8) || e->dims[d] < 0 || e->dims[d] > (1 << 24)) return 0;
        e->numel *= e->dims[d];
        if (e->numel > (1 << 24)) return 0;
    }
    const size_t bytes = (size_t)e->numel * 4;
    e->data = bytes <= r->size - *at ? malloc(bytes ? bytes : 1) : NULL;
    return e->data && ref_take(r, at, e->data, bytes);
}

static void ref_free(ref_file *r) {
    for (int i = 0; i < REF_MAX_ENTRIES; i++) free(r->e[i].data);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

static int ref_load(ref_file *r, const char *path) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open the reference %s (tests/reference/gpt2_reference.py writes it)", path);
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    r->bytes = len > 0 ? malloc((size_t)len) : NULL;
    r->size = r->bytes && fread(r->bytes, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    size_t at = 0;
    char magic[8];
    int32_t n = 0;
    int ok = ref_take(r, &at, magic, 8) && memcmp(magic, "DEFTREF1", 8) == 0 && ref_take(r, &at, &n, 4) &&
             n > 0 && n <= REF_MAX_ENTRIES;
    for (int i = 0; ok && i < n; i++) ok = ref_parse_entry(r, &at, &r->e[i]);
    r->n = ok ? n : 0;
    CHECK_MSG(ok && at == r->size, "%s is not a whole reference file", path);
    return ok && at == r->size;
}

static const ref_entry *ref_find(const ref_file *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->e[i].name, name) == 0) return &r->e[i];
    return NULL;
}

static const float *ref_f32(const ref_file *r, const char *name, int64_t numel) {
    const ref_entry *e = ref_find(r, name);
    CHECK_MSG(e && !e->is_int && e->numel == numel, "the reference has no f32 %s of %lld values", name,
              (long long)numel);
    return e && !e->is_int && e->numel == numel ? e->data : NULL;
}

/* max |got - want| over max |want|: one figure per tensor, as llm.c's test prints. */
static double ref_rel_error(const float *got, const float *want, int64_t n) {
    double err = 0, scale = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)want[i]);
        err = d > err || d != d ? d : err;
        scale = fabs((double)want[i]) > scale ? fabs((double)want[i]) : scale;
    }
    return err / scale;
}

typedef struct gpt2_ref_case {
    const char *what;
    deft_device dev;
    deft_dtype autocast;
    double tol_logits, tol_loss, tol_grad, tol_losses;
} gpt2_ref_case;

/* The model of the file's config on the case's device, with the file's weights and batch. */
static int gpt2_ref_model(gpt2 *m, const ref_file *r, const gpt2_ref_case *k) {
    const ref_entry *cfg = ref_find(r, "config");
    CHECK(cfg && cfg->is_int && cfg->numel == 7);
    if (!cfg || !cfg->is_int || cfg->numel != 7) return 0;
    const int32_t *c = cfg->data;
    const gpt2_config gc = {c[0], c[1], c[2], c[3], c[4]};
    const deft_status s = gpt2_build(m, &gc, c[5], k->dev, 1);
    CHECK_MSG(s == DEFT_OK, "%s: building the model: %s", k->what, deft_errmsg());
    if (s != DEFT_OK) return 0;
    int params = 0;
    for (int i = 0; i < r->n; i++) {
        if (strncmp(r->e[i].name, "param/", 6) != 0) continue;
        deft_tensor *p = deft_graph_find(m->g, r->e[i].name + 6);
        CHECK_MSG(p != NULL, "%s: the model has no parameter %s", k->what, r->e[i].name + 6);
        if (!p) return 0;
        CHECK_MSG(deft_tensor_numel(p) == r->e[i].numel, "%s: %s has %lld values, the reference %lld", k->what,
                  r->e[i].name + 6, (long long)deft_tensor_numel(p), (long long)r->e[i].numel);
        if (deft_tensor_numel(p) != r->e[i].numel) return 0;
        CHECK_OK(deft_param_set(p, r->e[i].data, (size_t)r->e[i].numel * 4));
        params++;
    }
    CHECK_MSG(params == 2 + 12 * (int)gc.layers + 2, "%s: %d parameters in the reference", k->what, params);
    return 1;
}

static void gpt2_ref_feed(const gpt2 *m, deft_program *p, const ref_file *r) {
    const ref_entry *x = ref_find(r, "x"), *y = ref_find(r, "y");
    CHECK(x && y && x->numel == m->batch * m->c.seq && y->numel == x->numel);
    if (!x || !y) return;
    CHECK_OK(deft_program_feed(p, m->x, x->data, (size_t)x->numel * 4));
    CHECK_OK(deft_program_feed(p, m->y, y->data, (size_t)y->numel * 4));
}

/* One forward and backward pass: logits, loss and every gradient against the file. */
static void gpt2_ref_check_grads(const ref_file *r, const gpt2_ref_case *k) {
    gpt2 m;
    if (!gpt2_ref_model(&m, r, k)) goto done;
    CHECK_OK(deft_backward(m.loss));
    deft_tensor *outs[64];
    int n_out = 0;
    outs[n_out++] = m.logits;
    outs[n_out++] = m.loss;
    for (int i = 0; i < r->n && n_out < 64; i++)
        if (strncmp(r->e[i].name, "grad/", 5) == 0) outs[n_out++] = deft_grad(deft_graph_find(m.g, r->e[i].name + 5));
    const deft_compile_options o = {.autocast = k->autocast};
    deft_program *p = deft_compile(m.g, outs, n_out, &o);
    CHECK_MSG(p != NULL, "%s: compile: %s", k->what, deft_errmsg());
    if (!p) goto done;
    gpt2_ref_feed(&m, p, r);
    CHECK_OK(deft_program_run(p));
    const int64_t nl = m.batch * m.c.seq * m.c.vocab;
    float *got = malloc(sizeof(float) * (size_t)nl), loss = 0;
    CHECK_OK(deft_program_read(p, m.logits, got, sizeof(float) * (size_t)nl));
    const float *want = ref_f32(r, "logits", nl);
    double e = want ? ref_rel_error(got, want, nl) : 1;
    printf("%s logits: relative error %.3g (tolerance %.3g)\n", k->what, e, k->tol_logits);
    CHECK_MSG(e <= k->tol_logits, "%s: logits off by %.3g", k->what, e);
    CHECK_OK(deft_program_read(p, m.loss, &loss, sizeof loss));
    want = ref_f32(r, "loss", 1);
    e = want ? fabs((double)loss - want[0]) / fabs(want[0]) : 1;
    printf("%s loss %.6f, reference %.6f\n", k->what, loss, want ? want[0] : 0.0f);
    CHECK_MSG(e <= k->tol_loss, "%s: loss %.6f against %.6f", k->what, loss, want ? want[0] : 0.0f);
    double worst = 0;
    const char *worst_name = "";
    /* Matched through the parameters: the gradient nodes' own names are deft's. */
    for (int i = 0; i < r->n; i++) {
        if (strncmp(r->e[i].name, "grad/", 5) != 0) continue;
        deft_tensor *gt = deft_grad(deft_graph_find(m.g, r->e[i].name + 5));
        const int64_t n = r->e[i].numel;
        float *g = malloc(sizeof(float) * (size_t)n);
        CHECK_OK(deft_program_read(p, gt, g, sizeof(float) * (size_t)n));
        const double ge = ref_rel_error(g, r->e[i].data, n);
        if (ge > worst || ge != ge) {
            worst = ge;
            worst_name = r->e[i].name + 5;
        }
        CHECK_MSG(ge <= k->tol_grad, "%s: the gradient of %s is off by %.3g", k->what, r->e[i].name + 5, ge);
        free(g);
    }
    printf("%s gradients: worst relative error %.3g (%s; tolerance %.3g)\n", k->what, worst, worst_name,
           k->tol_grad);
    free(got);
done:
    deft_graph_free(m.g);
}

/* 10 AdamW steps on the batch: each step's loss against the file's. */
static void gpt2_ref_check_steps(const ref_file *r, const gpt2_ref_case *k) {
    gpt2 m;
    const float *hp = ref_f32(r, "adamw", 5);
    const ref_entry *le = ref_find(r, "losses");
    if (!hp || !le || !gpt2_ref_model(&m, r, k)) {
        if (hp && le) deft_graph_free(m.g);
        return;
    }
    CHECK_OK(deft_backward(m.loss));
    const deft_adamw_options ao = {.lr = hp[0], .beta1 = hp[1], .beta2 = hp[2], .eps = hp[3], .weight_decay = hp[4]};
    deft_optimizer *opt = deft_adamw(m.g, &ao, NULL);
    CHECK(opt != NULL);
    if (opt) CHECK_OK(deft_optimizer_decay_2d_only(opt));
    deft_tensor *outs[2] = {m.loss, opt ? deft_optimizer_step(opt) : NULL};
    const deft_compile_options o = {.autocast = k->autocast};
    deft_program *p = opt ? deft_compile(m.g, outs, 2, &o) : NULL;
    CHECK_MSG(p != NULL, "%s: compile: %s", k->what, deft_errmsg());
    if (p) {
        gpt2_ref_feed(&m, p, r);
        const float *want = le->data;
        double worst = 0;
        for (int64_t i = 0; i < le->numel; i++) {
            float loss = 0;
            CHECK_OK(deft_program_run(p));
            CHECK_OK(deft_program_read(p, m.loss, &loss, sizeof loss));
            const double e = fabs((double)loss - want[i]) / fabs(want[i]);
            worst = e > worst || e != e ? e : worst;
            CHECK_MSG(e <= k->tol_losses, "%s: step %lld's loss %.6f against %.6f", k->what, (long long)i, loss,
                      want[i]);
        }
        printf("%s 10 AdamW steps: losses from %.4f to %.4f, worst relative error %.3g (tolerance %.3g)\n", k->what,
               want[0], want[le->numel - 1], worst, k->tol_losses);
    }
    deft_graph_free(m.g);
}

#endif
