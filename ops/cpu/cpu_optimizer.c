/* Running an optimizer's node: gather this run's gradients into the flat block, and every k-th run clip and apply
 * one update over the whole flat storage in a single pass. The formulas are torch.optim.SGD's and AdamW's; the CUDA
 * kernels (ops/cuda/cuda_optimizer.cu) follow this file line by line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "element.h"
#include "half.h"
#include "optimizer.h"

/* Elements [off, off + n) of the parameters into their low-precision copy (the compile option param_copies), rounded
 * as the CPU's cast rounds (deft_store_from_f64), so that a program reading the copy sees a cast's bits. */
static void deft_copy_range(const deft_optimizer *o, int64_t off, int64_t n) {
    if (!o->flat_low || o->dtype != DEFT_F32) return;
    const float *p = (const float *)o->flat_params + off;
    for (int64_t j = 0; j < n; j++) deft_store_from_f64(o->flat_low, o->low_dtype, off + j, p[j]);
}

void deft_cpu_optimizer_copy_refresh(const deft_optimizer *o) { deft_copy_range(o, 0, o->total); }

/* A bf16 or f16 gradient of an f32 weight (the autocast step's, ir/autocast.h) widened into dst: stored, or added
 * to what dst holds. Widening is exact, so this is what the cast back to f32 and an f32 gradient gave. */
static void deft_widen(float *dst, const uint16_t *src, deft_dtype dt, int64_t n, bool add) {
    for (int64_t j = 0; j < n; j++) {
        const float x = dt == DEFT_BF16 ? deft_bf16_unpack(src[j]) : deft_half_unpack(src[j]);
        dst[j] = add ? dst[j] + x : x;
    }
}

/* Sums (or, on the first micro-batch, copies) each parameter's gradient into its slot of the flat gradients; a
 * gradient in another dtype than T (bf16/f16 under f32 weights) is widened on the way. */
#define DEFT_GATHER(T)                                                                                               \
    static void deft_gather_##T(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads) {             \
        T *flat = o->flat_grads;                                                                                     \
        for (int i = 0; i < o->n_params; i++) {                                                                      \
            const T *g = grads[i];                                                                                   \
            T *dst = flat + o->offsets[i];                                                                           \
            int64_t n = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);                                   \
            if (srcs[i]->dtype != o->dtype) deft_widen((float *)dst, grads[i], srcs[i]->dtype, n, o->micro != 0);    \
            else if (o->micro == 0) memcpy(dst, g, (size_t)n * sizeof(T));                                           \
            else                                                                                                     \
                for (int64_t j = 0; j < n; j++) dst[j] += g[j];                                                      \
        }                                                                                                            \
    }

/* The sum of squares of the count elements of g that make one norm block, in order. */
#define DEFT_BLOCK_SUM(T)                                                                                            \
    static double deft_block_sum_##T(const T *g, int64_t count) {                                                    \
        double sum = 0.0;                                                                                            \
        for (int64_t j = 0; j < count; j++) sum += (double)g[j] * (double)g[j];                                      \
        return sum;                                                                                                  \
    }

/* Block by block (ir/optimizer.h), the blocks' sums added in order: the sum a split step forms the same way. */
#define DEFT_NORM(T)                                                                                                 \
    static double deft_norm_##T(const deft_optimizer *o, double scale) {                                             \
        const T *g = o->flat_grads;                                                                                  \
        double sum = 0.0;                                                                                            \
        for (int i = 0; i < o->n_params; i++)                                                                        \
            for (int b = o->block_first[i]; b < o->block_first[i + 1]; b++) {                                        \
                int64_t lo, hi;                                                                                      \
                deft_optimizer_block_range(o, i, b, &lo, &hi);                                                       \
                sum += deft_block_sum_##T(g + lo, hi - lo);                                                          \
            }                                                                                                        \
        return sqrt(sum) * scale;                                                                                    \
    }

/* The update of n elements of one parameter group (gr: its weight decay and lr scale): p, buf (and m, v) point at
 * their first one in the flat storage, g at their gradients (scaled by `scale`). Both the whole step and a piece run
 * it once per parameter. The group's rate o->lr * lr_scale is formed in double (exactly o->lr for a scale of 1). */
#define DEFT_SGD(T)                                                                                                  \
    static void deft_sgd_##T(const deft_optimizer *o, deft_optimizer_group gr, T *p, const T *g, T *buf, int64_t n,  \
                             T scale) {                                                                              \
        const T lr = (T)(o->lr * gr.lr_scale), mom = (T)o->sgd.momentum, damp = (T)(1.0 - o->sgd.dampening);        \
        const T wd = (T)gr.weight_decay;                                                                             \
        const int first = o->updates == 0, nesterov = o->sgd.nesterov;                                              \
        for (int64_t j = 0; j < n; j++) {                                                                            \
            T d = g[j] * scale;                                                                                      \
            if (wd != 0) d += wd * p[j];                                                                             \
            if (mom != 0) {                                                                                          \
                buf[j] = first ? d : mom * buf[j] + damp * d;                                                        \
                d = nesterov ? d + mom * buf[j] : buf[j];                                                            \
            }                                                                                                        \
            p[j] -= lr * d;                                                                                          \
        }                                                                                                            \
    }

#define DEFT_ADAMW(T)                                                                                                \
    static void deft_adamw_##T(const deft_optimizer *o, deft_optimizer_group gr, T *p, const T *g, T *m, T *v,       \
                               int64_t n, T scale) {                                                                 \
        const deft_adamw_options *a = &o->adamw;                                                                     \
        const double t = (double)(o->updates + 1), lr = o->lr * gr.lr_scale;                                         \
        const T b1 = (T)a->beta1, b2 = (T)a->beta2, eps = (T)a->eps;                                                 \
        const T decay = (T)(1.0 - lr * gr.weight_decay);                                                             \
        const T step = (T)(lr / (1.0 - pow(a->beta1, t)));                                                           \
        const T bc2_sqrt = (T)sqrt(1.0 - pow(a->beta2, t));                                                          \
        if (o->updates == 0) {                                                                                       \
            memset(m, 0, (size_t)n * sizeof(T));                                                                     \
            memset(v, 0, (size_t)n * sizeof(T));                                                                     \
        }                                                                                                            \
        for (int64_t j = 0; j < n; j++) {                                                                            \
            T d = g[j] * scale;                                                                                      \
            p[j] *= decay;                                                                                           \
            m[j] = b1 * m[j] + (1 - b1) * d;                                                                         \
            v[j] = b2 * v[j] + (1 - b2) * d * d;                                                                     \
            p[j] -= step * m[j] / (sqrt(v[j]) / bc2_sqrt + eps);                                                     \
        }                                                                                                            \
    }

/* One piece of a split step (ir/optimizer.h): per parameter, its blocks' sums into sums, then its update, with
 * the whole step's formulas and counters (a scale of 1: one micro-batch, no clipping). grads are in T (a low-precision
 * gradient was widened by deft_piece_run). */
#define DEFT_PIECE(T)                                                                                                \
    static void deft_piece_##T(const deft_optimizer *piece, const void *const *grads, double *sums) {                \
        const deft_optimizer *w = piece->part->whole;                                                                \
        for (int k = 0; k < piece->n_params; k++) {                                                                  \
            const int i = piece->part->first_param + k;                                                              \
            const T *g = grads[k];                                                                                   \
            const int64_t off = w->offsets[i];                                                                       \
            for (int b = w->block_first[i]; b < w->block_first[i + 1]; b++) {                                        \
                int64_t lo, hi;                                                                                      \
                deft_optimizer_block_range(w, i, b, &lo, &hi);                                                       \
                sums[b - piece->part->first_block] = deft_block_sum_##T(g + (lo - off), hi - lo);                    \
            }                                                                                                        \
            const int64_t n = deft_shape_numel(w->params[i]->ndim, w->params[i]->shape);                             \
            T *p = (T *)w->flat_params + off, *s0 = (T *)w->state0 + off;                                            \
            const deft_optimizer_group gr = deft_optimizer_group_of(w, i);                                           \
            if (w->kind == DEFT_OPTIM_SGD) deft_sgd_##T(w, gr, p, g, s0, n, (T)1);                                    \
            else deft_adamw_##T(w, gr, p, g, s0, (T *)w->state1 + off, n, (T)1);                                     \
            deft_copy_range(w, off, n);                                                                              \
        }                                                                                                            \
    }

DEFT_GATHER(float)
DEFT_GATHER(double)
DEFT_BLOCK_SUM(float)
DEFT_BLOCK_SUM(double)
DEFT_NORM(float)
DEFT_NORM(double)
DEFT_SGD(float)
DEFT_SGD(double)
DEFT_ADAMW(float)
DEFT_ADAMW(double)
DEFT_PIECE(float)
DEFT_PIECE(double)

/* The update over the flat storage, parameter by parameter with each one's group (elementwise: the same values as
 * one pass over it when every parameter takes the optimizer's own options). */
#define DEFT_UPDATE_ALL(T)                                                                                           \
    static void deft_update_all_##T(const deft_optimizer *o, T scale) {                                              \
        for (int i = 0; i < o->n_params; i++) {                                                                      \
            const int64_t off = o->offsets[i], n = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);        \
            T *p = (T *)o->flat_params + off, *s0 = (T *)o->state0 + off;                                            \
            const T *g = (const T *)o->flat_grads + off;                                                             \
            const deft_optimizer_group gr = deft_optimizer_group_of(o, i);                                           \
            if (o->kind == DEFT_OPTIM_SGD) deft_sgd_##T(o, gr, p, g, s0, n, scale);                                  \
            else deft_adamw_##T(o, gr, p, g, s0, (T *)o->state1 + off, n, scale);                                    \
        }                                                                                                            \
    }

DEFT_UPDATE_ALL(float)
DEFT_UPDATE_ALL(double)

/* torch.nn.utils.clip_grad_norm_'s factor: max / (norm + 1e-6), never above 1. */
static double deft_clip_factor(const deft_optimizer *o, double norm) {
    if (o->max_grad_norm <= 0.0) return 1.0;
    double c = o->max_grad_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

/* GradScaler's update: a skipped step lowers the scale at once, growth_interval clean ones in a row raise it. */
static void deft_scaler_after(deft_optimizer *o, bool skipped) {
    deft_optimizer_scaler *sc = &o->scaler;
    if (skipped) {
        sc->scale = (float)(sc->scale * sc->backoff);
        sc->tracker = 0;
        sc->skipped++;
    } else if (++sc->tracker == sc->interval) {
        sc->scale = (float)(sc->scale * sc->growth);
        sc->tracker = 0;
    }
}

/* With loss scaling the gradients carry the scale: the norm and the update see them divided by it, and an inf or NaN
 * among them (a sum of squares in double is finite exactly when every f32 or f64 gradient is) skips the update. */
static void deft_update(deft_optimizer *o) {
    bool f32 = o->dtype == DEFT_F32;
    double mean = 1.0 / (double)o->accumulate_steps;
    if (o->scaler.on) mean /= (double)o->scaler.scale;
    double norm = f32 ? deft_norm_float(o, mean) : deft_norm_double(o, mean);
    o->last_norm = norm;
    if (o->scaler.on && !isfinite(norm)) {
        deft_scaler_after(o, true);
        return;
    }
    double scale = mean * deft_clip_factor(o, norm);
    if (f32) deft_update_all_float(o, (float)scale);
    else deft_update_all_double(o, scale);
    deft_copy_range(o, 0, o->total);
    o->updates++;
    if (o->scaler.on) deft_scaler_after(o, false);
}

/* The finisher of a split step: the pieces' block sums in flat order, added as deft_norm adds them; the counters
 * advance once. */
static void deft_finish(deft_optimizer *f, const void *const *sums, float *out) {
    const deft_optimizer_part *fp = f->part;
    deft_optimizer *w = fp->whole;
    double sum = 0.0;
    for (int k = 0; k < fp->n_pieces; k++) {
        const double *s = sums[k];
        const int first = fp->piece_first_param[k];
        const int n = w->block_first[first + fp->piece_n_params[k]] - w->block_first[first];
        for (int b = 0; b < n; b++) sum += s[b];
    }
    w->last_norm = sqrt(sum);
    w->updates++;
    *out = (float)w->last_norm;
}

/* A piece on the CPU: its low-precision gradients widened into one f32 buffer first (the piece's formulas read T). */
static deft_status deft_piece_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                  double *sums) {
    if (o->dtype != DEFT_F32) {
        deft_piece_double(o, grads, sums);
        return DEFT_OK;
    }
    int64_t low = 0;
    for (int k = 0; k < o->n_params; k++)
        if (srcs[k]->dtype != DEFT_F32) low += deft_shape_numel(srcs[k]->ndim, srcs[k]->shape);
    if (low == 0) {
        deft_piece_float(o, grads, sums);
        return DEFT_OK;
    }
    const void **wide = malloc((size_t)o->n_params * sizeof *wide);
    float *buf = malloc((size_t)low * sizeof *buf);
    if (!wide || !buf) {
        free(wide);
        free(buf);
        return deft_set_error(DEFT_ERR_OOM, "optimizer %s: out of host memory widening %lld gradient elements",
                              o->step_node->name, (long long)low);
    }
    float *at = buf;
    for (int k = 0; k < o->n_params; k++) {
        wide[k] = grads[k];
        if (srcs[k]->dtype == DEFT_F32) continue;
        const int64_t n = deft_shape_numel(srcs[k]->ndim, srcs[k]->shape);
        deft_widen(at, grads[k], srcs[k]->dtype, n, false);
        wide[k] = at;
        at += n;
    }
    deft_piece_float(o, wide, sums);
    free(wide);
    free(buf);
    return DEFT_OK;
}

/* A part of a split step on the CPU: a piece's block sums, or the finisher's norm from the pieces' sums. */
deft_status deft_cpu_optimizer_part_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads,
                                        void *out) {
    if (o->part->finisher) {
        deft_finish(o, grads, out);
        return DEFT_OK;
    }
    return deft_piece_run(o, srcs, grads, out);
}

/* The whole step on the CPU, between the steps around it: gathers this micro-batch's gradients and updates once per
 * accumulate_steps runs. */
deft_status deft_cpu_optimizer_run(deft_optimizer *o, deft_tensor *const *srcs, const void *const *grads, void *out) {
    if (o->dtype == DEFT_F32) deft_gather_float(o, srcs, grads);
    else deft_gather_double(o, srcs, grads);
    if (++o->micro == o->accumulate_steps) {
        o->micro = 0;
        deft_update(o);
    }
    *(float *)out = (float)o->last_norm;
    return DEFT_OK;
}
