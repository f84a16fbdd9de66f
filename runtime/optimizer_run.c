/* Running an optimizer's node: gather this run's gradients into the flat block, and every k-th run clip and apply
 * one update over the whole flat storage in a single pass. The formulas are torch.optim.SGD's and AdamW's; the CUDA
 * kernels (ops/cuda/cuda_optimizer.cu) follow this file line by line. */
#include <math.h>
#include <string.h>

#include "optimizer.h"

/* Sums (or, on the first micro-batch, copies) each parameter's gradient into its slot of the flat gradients. */
#define DEFT_GATHER(T)                                                                                               \
    static void deft_gather_##T(deft_optimizer *o, const void *const *grads) {                                       \
        T *flat = o->flat_grads;                                                                                     \
        for (int i = 0; i < o->n_params; i++) {                                                                      \
            const T *g = grads[i];                                                                                   \
            T *dst = flat + o->offsets[i];                                                                           \
            int64_t n = deft_shape_numel(o->params[i]->ndim, o->params[i]->shape);                                   \
            if (o->micro == 0) memcpy(dst, g, (size_t)n * sizeof(T));                                                \
            else                                                                                                     \
                for (int64_t j = 0; j < n; j++) dst[j] += g[j];                                                      \
        }                                                                                                            \
    }

#define DEFT_NORM(T)                                                                                                 \
    static double deft_norm_##T(const deft_optimizer *o, double scale) {                                             \
        const T *g = o->flat_grads;                                                                                  \
        double sum = 0.0;                                                                                            \
        for (int64_t j = 0; j < o->total; j++) sum += (double)g[j] * (double)g[j];                                   \
        return sqrt(sum) * scale;                                                                                    \
    }

#define DEFT_SGD(T)                                                                                                  \
    static void deft_sgd_##T(deft_optimizer *o, T scale) {                                                           \
        T *p = o->flat_params, *g = o->flat_grads, *buf = o->state0;                                                 \
        const T lr = (T)o->lr, mom = (T)o->sgd.momentum, damp = (T)(1.0 - o->sgd.dampening);                        \
        const T wd = (T)o->sgd.weight_decay;                                                                         \
        const int first = o->updates == 0, nesterov = o->sgd.nesterov;                                               \
        for (int64_t j = 0; j < o->total; j++) {                                                                     \
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
    static void deft_adamw_##T(deft_optimizer *o, T scale) {                                                         \
        T *p = o->flat_params, *g = o->flat_grads, *m = o->state0, *v = o->state1;                                   \
        const deft_adamw_options *a = &o->adamw;                                                                     \
        const double t = (double)(o->updates + 1);                                                                   \
        const T b1 = (T)a->beta1, b2 = (T)a->beta2, eps = (T)a->eps;                                                 \
        const T decay = (T)(1.0 - o->lr * a->weight_decay);                                                          \
        const T step = (T)(o->lr / (1.0 - pow(a->beta1, t)));                                                        \
        const T bc2_sqrt = (T)sqrt(1.0 - pow(a->beta2, t));                                                          \
        if (o->updates == 0) {                                                                                       \
            memset(m, 0, (size_t)o->total * sizeof(T));                                                              \
            memset(v, 0, (size_t)o->total * sizeof(T));                                                              \
        }                                                                                                            \
        for (int64_t j = 0; j < o->total; j++) {                                                                     \
            T d = g[j] * scale;                                                                                      \
            p[j] *= decay;                                                                                           \
            m[j] = b1 * m[j] + (1 - b1) * d;                                                                         \
            v[j] = b2 * v[j] + (1 - b2) * d * d;                                                                     \
            p[j] -= step * m[j] / (sqrt(v[j]) / bc2_sqrt + eps);                                                     \
        }                                                                                                            \
    }

DEFT_GATHER(float)
DEFT_GATHER(double)
DEFT_NORM(float)
DEFT_NORM(double)
DEFT_SGD(float)
DEFT_SGD(double)
DEFT_ADAMW(float)
DEFT_ADAMW(double)

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
    if (o->kind == DEFT_OPTIM_SGD) {
        if (f32) deft_sgd_float(o, (float)scale);
        else deft_sgd_double(o, scale);
    } else {
        if (f32) deft_adamw_float(o, (float)scale);
        else deft_adamw_double(o, scale);
    }
    o->updates++;
    if (o->scaler.on) deft_scaler_after(o, false);
}

/* The CPU runs the step here, between the steps around it; a GPU queues it on `stream` (ops/cuda/cuda_optimizer.cu),
 * with the per-run state on the device. */
deft_status deft_optimizer_run(deft_optimizer *o, const void *const *grads, void *out, void *stream) {
    if (o->device.type != DEFT_CPU) {
#ifdef DEFT_HAVE_CUDA
        return deft_cuda_optimizer_run(o, grads, out, stream);
#else
        char d[32];
        (void)stream;
        return deft_set_error(DEFT_ERR_NO_CUDA, "optimizer: the parameters are on %s, but deft was built without CUDA",
                              deft_device_str(o->device, d, sizeof d));
#endif
    }
    (void)stream;
    if (o->dtype == DEFT_F32) deft_gather_float(o, grads);
    else deft_gather_double(o, grads);
    if (++o->micro == o->accumulate_steps) {
        o->micro = 0;
        deft_update(o);
    }
    *(float *)out = (float)o->last_norm;
    return DEFT_OK;
}
