/* Attention (DEFT_OP_ATTENTION) and its gradient (DEFT_OP_ATTENTION_GRAD) through cuDNN's fused flash-attention
 * engines, f16 and bf16, head sizes a multiple of 8 up to 128, on sm80 and newer; the graphs are those of
 * cuda_attention_cudnn_graph.cu. Whatever cuDNN cannot take is refused with DEFT_CUDNN_ATTENTION_REFUSED and the
 * reason (cuDNN's own text included), so the caller can run deft's kernels (cuda_attention.cu) instead.
 *
 * The contract is that of deft's kernels, so either may run either half: the forward writes o and, past it (at
 * deft_node_extra_offset), the f32 log-sum-exp of each row of scale q k^T, which is cuDNN's "stats" (m + log z,
 * natural log, scale applied); the backward reads o and those statistics from the forward's buffer and keeps
 * rowsum(dO * o) (cuDNN's softmax_sum) in the gradient node's f32 scratch.
 *
 * Determinism: the backward's default form accumulates dq in f32 with atomics across key blocks (as the frontend's
 * default on cuDNN 9), whose sums vary in order from run to run; the accumulator is part of the gradient node's
 * buffer (ir/graph_internal.h's deft_attention_has_accum), so the stream's scratch holds cuDNN's own part only.
 * With DEFT_CUDA_DETERMINISTIC (the default of
 * deft_cudnn_attention) dq is instead a product of the whole dS with k (the frontend's is_deterministic_algorithm on
 * Hopper), no atomics, and engines cuDNN marks nondeterministic are passed over unless no other takes the graph
 * (deft_cudnn_attention_describe then says "nondeterministic"): deft's own backward is deterministic, so the same
 * bits every run is what a program already gets. That form may ask for more workspace (the frontend's comments have
 * cuDNN keep dP, B * H * T * T halves, in it); where it does not fit the stream's cuDNN scratch the call is refused
 * with the numbers.
 *
 * Plans: one per (device, dtype, B, H, T, D, causal, scale, forward or backward, deterministic), built on first use
 * and kept for the life of the process (until deft_cudnn_attention_release) in a fixed table: a CUDA Graph that
 * captured a plan's kernels may replay them at any time, so a plan is never evicted. Building one compiles kernels
 * and touches the device, so it is never done inside a stream capture: a problem first met in a capture is refused
 * (deft's kernels run it there); the eager run before a capture builds what the replay needs. A problem cuDNN
 * refused is remembered with the reason and refused at once when met again, rather than rebuilt every step.
 *
 * Layouts: q, k, v apart (row-major [B, H, T, D] each) or packed (p.attn.heads: the thirds of one [B, T, 3C], the
 * output [B, T, H, D], the gradient written into one [B, T, 3C]); the graphs describe the strides they have, which
 * cuDNN's SDPA takes with D's stride 1 and 16-byte aligned bases and strides (checked here: otherwise refused, and
 * deft's kernels run it). The layout is part of a plan's key. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include "cuda_common.cuh"

#define DEFT_CATT_MAX_HEAD 128
#define DEFT_CATT_MAX_DEVICES 64
#define DEFT_CATT_TEXT 4096   /* bytes of a refusal's full text */

/* The compute capability major of cuda:dev, asked once (0: not yet, -1: unknown). */
static std::atomic<int> deft_catt_arch[DEFT_CATT_MAX_DEVICES];

static int deft_catt_arch_major(int dev) {
    if (dev < 0 || dev >= DEFT_CATT_MAX_DEVICES) return -1;
    int major = deft_catt_arch[dev].load();
    if (major != 0) return major;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        major = -1;
    }
    deft_catt_arch[dev].store(major);
    return major;
}

/* The oldest runtime cuDNN these graphs were run on (bench/RESULTS.md, eighteenth round); the frontend's own lowering
 * adds a padding-mask workaround to the backward before 9.16, which these graphs do not, and the tests check the
 * results against deft's kernels on whatever runtime they meet. */
#define DEFT_CATT_MIN_CUDNN 91400

/* The runtime cuDNN's version (0 without cuDNN in the build). */
static size_t deft_catt_runtime_version(void);

#ifdef DEFT_HAVE_CUDNN
static const bool deft_catt_have_cudnn = true;
#else
static const bool deft_catt_have_cudnn = false;
#endif

/* false, with why set */
static bool deft_catt_no(char *why, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static bool deft_catt_no(char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return false;
}

/* Whether cuDNN's engines take node n at all (dtype, shape, device); when not, why. No cuDNN call. */
static bool deft_catt_check(const deft_tensor *n, char *why, size_t cap) {
    const bool fwd = n->op == DEFT_OP_ATTENTION;
    if (!fwd && n->op != DEFT_OP_ATTENTION_GRAD) return deft_catt_no(why, cap, "not an attention node");
    if (!deft_catt_have_cudnn)
        return deft_catt_no(why, cap, "this build has no cuDNN (cudnn.h and libcudnn were not found)");
    if (n->dtype != DEFT_F16 && n->dtype != DEFT_BF16)
        return deft_catt_no(why, cap, "cuDNN's fused attention takes f16 and bf16, not %s", deft_dtype_name(n->dtype));
    const bool packed = n->p.attn.heads > 0;
    if (n->ndim != (packed ? 3 : fwd ? 4 : 5) || n->device.type != DEFT_CUDA)
        return deft_catt_no(why, cap, "not a [B, H, T, D] (or packed [B, T, 3C]) attention node on a GPU");
    const deft_attention_dims a = deft_attention_dims_of(n);
    const int64_t b = a.b, h = a.h, t = a.t, d = a.d;
    if (d % 8 != 0 || d > DEFT_CATT_MAX_HEAD)
        return deft_catt_no(why, cap, "cuDNN's fused attention takes head sizes that are multiples of 8 up to %d, "
                            "not %lld", DEFT_CATT_MAX_HEAD, (long long)d);
    const deft_attention_layout l = deft_attention_layout_of(n);
    const int64_t per16 = 16 / (int64_t)deft_dtype_size(n->dtype);   /* elements in 16 bytes */
    if (l.qkv.sb % per16 || l.qkv.sh % per16 || l.qkv.st % per16 || l.out.sb % per16 || l.out.sh % per16 ||
        l.out.st % per16 || l.part % per16)
        return deft_catt_no(why, cap, "cuDNN's fused attention needs 16-byte aligned strides (packed C = %lld)",
                            (long long)(h * d));
    if (!fwd && t < 2)   /* the frontend refuses s_q = s_kv = 1 for the backward */
        return deft_catt_no(why, cap, "cuDNN's fused attention backward needs T >= 2 (T = %lld)", (long long)t);
    int64_t scores = 0;   /* the virtual [B, H, T, T] scores need int64 sizes (base/checked.h's helpers are C only) */
    if (b < 1 || h < 1 || t < 1 || __builtin_mul_overflow(b, h, &scores) ||
        __builtin_mul_overflow(scores, t, &scores) || __builtin_mul_overflow(scores, t, &scores))
        return deft_catt_no(why, cap, "B * H * T * T is past int64");
    const size_t version = deft_catt_runtime_version();
    if (version < DEFT_CATT_MIN_CUDNN)
        return deft_catt_no(why, cap, "the runtime cuDNN %zu is older than the %d these graphs are written for",
                            version, DEFT_CATT_MIN_CUDNN);
    const int major = deft_catt_arch_major(n->device.index);
    if (major < 8)
        return deft_catt_no(why, cap, "cuDNN's fused attention needs sm80 or newer (cuda:%d is %s)", n->device.index,
                            major < 0 ? "unknown" : "older");
    return true;
}

extern "C" bool deft_cudnn_attention_usable(const deft_tensor *n) {
    char why[192];
    return deft_catt_check(n, why, sizeof why);
}

/* The full text of this thread's last refusal (deft_errmsg holds its first 1023 bytes). */
static thread_local char deft_catt_refusal[DEFT_CATT_TEXT];

static deft_status deft_catt_refuse(const deft_tensor *n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static deft_status deft_catt_refuse(const deft_tensor *n, const char *fmt, ...) {
    char reason[DEFT_CATT_TEXT];   /* cut to what fits past the node's description */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    char shape[96];
    deft_shape_str(n->ndim, n->shape, shape, sizeof shape);
    const char *causal = n->p.attn.causal ? ", causal" : "";
    const int head = snprintf(deft_catt_refusal, sizeof deft_catt_refusal, "cuda %s (%s %s%s) through cuDNN: ",
                              deft_op_name(n->op), deft_dtype_name(n->dtype), shape, causal);
    const size_t used = head > 0 && (size_t)head < sizeof deft_catt_refusal ? (size_t)head : 0;
    const size_t len = strnlen(reason, sizeof deft_catt_refusal - used - 1);
    memcpy(deft_catt_refusal + used, reason, len);
    deft_catt_refusal[used + len] = '\0';
    return deft_set_error(DEFT_CUDNN_ATTENTION_REFUSED, "%s", deft_catt_refusal);
}

#ifndef DEFT_HAVE_CUDNN

extern "C" deft_status deft_cudnn_attention_flags(const deft_tensor *n, void *out, const void *const *in,
                                                  cudaStream_t st, unsigned flags) {
    (void)out, (void)in, (void)st, (void)flags;
    char why[192];
    deft_catt_check(n, why, sizeof why);
    return deft_catt_refuse(n, "%s", why);
}

extern "C" deft_status deft_cudnn_attention_prepare(const deft_tensor *n, cudaStream_t st, unsigned flags) {
    (void)n, (void)st, (void)flags;
    return DEFT_OK;
}

extern "C" int deft_cudnn_attention_describe(const deft_tensor *n, unsigned flags, char *buf, size_t cap) {
    (void)n, (void)flags;
    if (cap) snprintf(buf, cap, "%s", deft_catt_refusal);
    return 0;
}

extern "C" void deft_cudnn_attention_release(int dev) { (void)dev; }

static size_t deft_catt_runtime_version(void) { return 0; }

#else

#include "cuda_attention_cudnn.cuh"

static size_t deft_catt_runtime_version(void) { return cudnnGetVersion(); }

#define DEFT_CATT_PLANS 64        /* plans kept; past this, new problems are refused */
#define DEFT_CATT_ALIGN 16        /* the byte alignment the tensors are described with */

typedef struct deft_catt_key {
    int dev, dtype, forward, causal, deterministic, packed;
    int64_t b, h, t, d;
    double scale;
} deft_catt_key;

typedef struct deft_catt_entry {
    deft_catt_key key;
    deft_cg g;              /* every descriptor of the graph and its plan */
    deft_cg_plan plan;
    int variant;            /* which form of the graph cuDNN took (cuda_attention_cudnn.cuh) */
    int accum;              /* the backward's f32 dq accumulator: in the node's buffer (deft_attention_accum_offset) */
    size_t ws_bytes;        /* the workspace the call needs */
    float scale, neg_inf, one;   /* by-value operands: cuDNN reads them at each execution */
} deft_catt_entry;

static cudnnHandle_t deft_catt_handles[DEFT_CATT_MAX_DEVICES];
/* Per device, held across a call: a handle serves one stream at a time (as cuda_conv.cu's). */
static std::mutex deft_catt_locks[DEFT_CATT_MAX_DEVICES];
/* The plans of every device; entries never change once in, so a lookup holds the lock only to read the table. */
static deft_catt_entry *deft_catt_table[DEFT_CATT_PLANS];
static int deft_catt_count;
static std::mutex deft_catt_table_lock;
/* Problems cuDNN refused, with why: asked again, they are refused at once instead of building their graphs (and
 * compiling kernels) at every step. Guarded by deft_catt_table_lock. */
typedef struct deft_catt_refused {
    deft_catt_key key;
    char why[1024];
} deft_catt_refused;
static deft_catt_refused deft_catt_refusals[DEFT_CATT_PLANS];
static int deft_catt_n_refused;

static deft_catt_key deft_catt_key_of(const deft_tensor *n, int dev, bool deterministic) {
    deft_catt_key k;
    memset(&k, 0, sizeof k);   /* the key is compared bytewise */
    k.dev = dev, k.dtype = (int)n->dtype, k.forward = n->op == DEFT_OP_ATTENTION, k.causal = n->p.attn.causal != 0;
    k.deterministic = !k.forward && deterministic;
    k.packed = n->p.attn.heads > 0;
    const deft_attention_dims a = deft_attention_dims_of(n);
    k.b = a.b, k.h = a.h, k.t = a.t, k.d = a.d, k.scale = n->p.attn.scale;
    return k;
}

static deft_catt_entry *deft_catt_find(const deft_catt_key &k) {
    std::lock_guard<std::mutex> guard(deft_catt_table_lock);
    for (int i = 0; i < deft_catt_count; i++)
        if (memcmp(&deft_catt_table[i]->key, &k, sizeof k) == 0) return deft_catt_table[i];
    return NULL;
}

/* Why k was refused before, copied into why (false if it was not). */
static bool deft_catt_was_refused(const deft_catt_key &k, char *why, size_t cap) {
    std::lock_guard<std::mutex> guard(deft_catt_table_lock);
    for (int i = 0; i < deft_catt_n_refused; i++)
        if (memcmp(&deft_catt_refusals[i].key, &k, sizeof k) == 0) {
            snprintf(why, cap, "%s", deft_catt_refusals[i].why);
            return true;
        }
    return false;
}

static void deft_catt_remember_refusal(const deft_catt_key &k, const char *why) {
    std::lock_guard<std::mutex> guard(deft_catt_table_lock);
    if (deft_catt_n_refused == DEFT_CATT_PLANS) return;   /* past this, each is asked of cuDNN again */
    deft_catt_refused *r = &deft_catt_refusals[deft_catt_n_refused++];
    r->key = k;
    const size_t len = strnlen(why, sizeof r->why - 1);   /* the first 1023 bytes */
    memcpy(r->why, why, len);
    r->why[len] = '\0';
}

/* Whether `st` is capturing into a CUDA Graph; a stream that cannot be asked counts as capturing. */
static bool deft_catt_capturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
    }
    return cs != cudaStreamCaptureStatusNone;
}

/* The current device's handle bound to st; the caller holds the device's lock. */
static deft_status deft_catt_handle(const deft_tensor *n, int dev, cudaStream_t st, cudnnHandle_t *h) {
    cudnnStatus_t cs;
    if (!deft_catt_handles[dev] && (cs = cudnnCreate(&deft_catt_handles[dev])) != CUDNN_STATUS_SUCCESS) {
        deft_catt_handles[dev] = NULL;
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cudnnCreate failed: %s", deft_op_name(n->op),
                              cudnnGetErrorString(cs));
    }
    if ((cs = cudnnSetStream(deft_catt_handles[dev], st)) != CUDNN_STATUS_SUCCESS)
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cudnnSetStream failed: %s", deft_op_name(n->op),
                              cudnnGetErrorString(cs));
    *h = deft_catt_handles[dev];
    return DEFT_OK;
}

/* Builds k's graph and chooses its plan within `cap` bytes of workspace, trying each form of the graph in turn. */
static deft_status deft_catt_build(const deft_tensor *n, cudnnHandle_t h, const deft_catt_key &k, size_t cap,
                                   deft_catt_entry **out) {
    deft_catt_entry *e = (deft_catt_entry *)calloc(1, sizeof *e);
    if (!e) return deft_set_error(DEFT_ERR_OOM, "cuda %s: no host memory for a cuDNN plan", deft_op_name(n->op));
    e->key = k;
    e->scale = (float)k.scale, e->neg_inf = -INFINITY, e->one = 1.0f;
    /* The backward's f32 dq accumulator lives in the gradient node's buffer (deft_attention_accum_offset), not here. */
    e->accum = !k.forward && !k.deterministic;
    const size_t plan_cap = cap;
    char why[DEFT_CATT_TEXT];
    why[0] = '\0';
    for (int variant = 0; variant < DEFT_CATT_VARIANTS; variant++) {
        const deft_catt_shape s = {k.b, k.h, k.t, k.d, k.dtype == DEFT_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16,
                                   k.forward != 0, k.causal != 0, k.deterministic != 0, k.packed != 0, variant};
        deft_cg_init(&e->g);
        if (deft_catt_build_graph(&e->g, h, &s) && deft_cg_choose_plan(&e->g, h, k.deterministic != 0, plan_cap,
                                                                       &e->plan)) {
            e->variant = variant;
            e->ws_bytes = (size_t)e->plan.workspace;
            *out = e;
            return DEFT_OK;
        }
        const size_t used = strlen(why);
        snprintf(why + used, sizeof why - used, "%sgraph form %d: %s", variant ? "; " : "", variant, e->g.what);
        deft_cg_free(&e->g);
    }
    free(e);
    return deft_catt_refuse(n, "%s", why);
}

/* The plan for k: cached, or built now (never inside a capture, where not even a handle is made) and kept. The
 * caller holds the device's lock. */
static deft_status deft_catt_entry_for(const deft_tensor *n, const deft_catt_key &k, cudaStream_t st,
                                       deft_catt_entry **out) {
    if ((*out = deft_catt_find(k)) != NULL) return DEFT_OK;
    char before[1024];
    if (deft_catt_was_refused(k, before, sizeof before))
        return deft_catt_refuse(n, "refused when first met (%s)", before);
    if (deft_catt_capturing(st))
        return deft_catt_refuse(n, "no plan was built for this problem before the CUDA Graph capture, and building "
                                "one compiles kernels and touches the device, which a capture does not allow");
    {
        std::lock_guard<std::mutex> guard(deft_catt_table_lock);
        if (deft_catt_count == DEFT_CATT_PLANS)
            return deft_catt_refuse(n, "the %d plans kept are all taken (plans are never evicted: a CUDA Graph may "
                                    "still replay their kernels)", DEFT_CATT_PLANS);
    }
    cudnnHandle_t h = NULL;
    deft_status s = deft_catt_handle(n, k.dev, st, &h);
    if (s != DEFT_OK) return s;
    const size_t cap = deft_stream_workspace_cap(k.dev, st, DEFT_WORKSPACE_CUDNN);
    deft_catt_entry *e = NULL;
    if ((s = deft_catt_build(n, h, k, cap, &e)) != DEFT_OK) {
        if (s == DEFT_CUDNN_ATTENTION_REFUSED) deft_catt_remember_refusal(k, deft_catt_refusal);
        return s;
    }
    std::lock_guard<std::mutex> guard(deft_catt_table_lock);
    if (deft_catt_count == DEFT_CATT_PLANS) {   /* another device filled it meanwhile */
        deft_cg_free(&e->g);
        free(e);
        return deft_catt_refuse(n, "the %d plans kept are all taken", DEFT_CATT_PLANS);
    }
    deft_catt_table[deft_catt_count++] = e;
    *out = e;
    return DEFT_OK;
}

/* The variant pack of one call: the tensors' ids and addresses, the by-value scalars, the workspace. */
typedef struct deft_catt_pack {
    int64_t uids[16];
    void *ptrs[16];
    int n;
} deft_catt_pack;

static void deft_catt_put(deft_catt_pack *p, int64_t uid, const void *ptr) {
    p->uids[p->n] = uid;
    p->ptrs[p->n++] = (void *)ptr;
}

/* q, k and v from the node's inputs (in + 1 for the gradient): three buffers, or the thirds of one (packed); their
 * ids follow one another. */
static void deft_catt_put_qkv(const deft_tensor *n, const void *const *in, deft_catt_pack *p) {
    const size_t part = (size_t)deft_attention_layout_of(n).part * deft_dtype_size(n->dtype);
    const bool packed = n->p.attn.heads > 0;
    for (int i = 0; i < 3; i++)
        deft_catt_put(p, DEFT_CATT_UID_Q + i, packed ? (const char *)in[0] + i * part : in[i]);
}

static void deft_catt_pack_of(const deft_tensor *n, const deft_catt_entry *e, void *out, const void *const *in,
                              deft_catt_pack *p) {
    p->n = 0;
    deft_catt_put(p, DEFT_CATT_UID_SCALE, &e->scale);
    if (e->key.causal) deft_catt_put(p, DEFT_CATT_UID_NEG_INF, &e->neg_inf);
    if (e->key.forward) {
        deft_catt_put_qkv(n, in, p);
        deft_catt_put(p, DEFT_CATT_UID_O, out);
        deft_catt_put(p, DEFT_CATT_UID_STATS, (char *)out + deft_node_extra_offset(n));
        return;
    }
    /* dq, dk and dv part elements apart in one buffer */
    const size_t part = (size_t)deft_attention_layout_of(n).part * deft_dtype_size(n->dtype);
    const int last = n->nsrc - 1;   /* the forward node: its value, then its statistics */
    deft_catt_put(p, DEFT_CATT_UID_ONE, &e->one);
    deft_catt_put(p, DEFT_CATT_UID_DO, in[0]);
    deft_catt_put_qkv(n, in + 1, p);
    deft_catt_put(p, DEFT_CATT_UID_O, in[last]);
    deft_catt_put(p, DEFT_CATT_UID_STATS, (const char *)in[last] + deft_node_extra_offset(n->src[last]));
    deft_catt_put(p, DEFT_CATT_UID_DQ, out);
    deft_catt_put(p, DEFT_CATT_UID_DK, (char *)out + part);
    deft_catt_put(p, DEFT_CATT_UID_DV, (char *)out + 2 * part);
    deft_catt_put(p, DEFT_CATT_UID_DELTA, (char *)out + deft_node_extra_offset(n));
    if (e->accum) deft_catt_put(p, DEFT_CATT_UID_ACCUM, (char *)out + deft_attention_accum_offset(n));
}

/* Enqueues e's plan on the handle's stream. Setting up the pack refuses (nothing ran); a failed execution whose
 * status says the arguments were refused is a refusal too, anything else a runtime error. */
static deft_status deft_catt_execute(const deft_tensor *n, cudnnHandle_t h, const deft_catt_entry *e,
                                     const deft_catt_pack *p, void *ws) {
    cudnnBackendDescriptor_t vp = NULL;
    const int64_t count = p->n;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, p->uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, p->ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
    const bool set_up = s == CUDNN_STATUS_SUCCESS;
    if (set_up) s = cudnnBackendExecute(h, e->plan.plan, vp);
    char last[512];
    last[0] = '\0';
    if (s != CUDNN_STATUS_SUCCESS) cudnnGetLastErrorString(last, sizeof last);
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (s == CUDNN_STATUS_SUCCESS) return DEFT_OK;
    const int category = CUDNN_STATUS_CATEGORY(s);
    if (!set_up || category == CUDNN_STATUS_BAD_PARAM || category == CUDNN_STATUS_NOT_SUPPORTED)
        return deft_catt_refuse(n, "%s: %s (status %d); cuDNN says: %s",
                                set_up ? "cudnnBackendExecute" : "the variant pack", cudnnGetErrorString(s), (int)s,
                                last);
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s (%s) through cuDNN: cudnnBackendExecute failed: %s (status %d); "
                          "cuDNN says: %s", deft_op_name(n->op), deft_dtype_name(n->dtype), cudnnGetErrorString(s),
                          (int)s, last);
}

/* Every address the plan reads or writes has the alignment its tensors were described with. */
static bool deft_catt_aligned(const deft_catt_pack *p) {
    for (int i = 0; i < p->n; i++) {
        const int64_t uid = p->uids[i];
        if (uid == DEFT_CATT_UID_SCALE || uid == DEFT_CATT_UID_NEG_INF || uid == DEFT_CATT_UID_ONE) continue;
        if ((uintptr_t)p->ptrs[i] % DEFT_CATT_ALIGN != 0) return false;
    }
    return true;
}

static deft_status deft_catt_run(const deft_tensor *n, void *out, const void *const *in, cudaStream_t st, int dev,
                                 unsigned flags) {
    std::lock_guard<std::mutex> guard(deft_catt_locks[dev]);
    const deft_catt_key k = deft_catt_key_of(n, dev, (flags & DEFT_CUDA_DETERMINISTIC) != 0);
    deft_catt_entry *e = NULL;
    deft_status s = deft_catt_entry_for(n, k, st, &e);
    if (s != DEFT_OK) return s;
    cudnnHandle_t h = NULL;   /* made with the plan: binding it to st is host work only, capture or not */
    if ((s = deft_catt_handle(n, dev, st, &h)) != DEFT_OK) return s;
    void *ws = NULL;
    size_t held = 0;
    s = deft_stream_workspace_reserve(dev, st, DEFT_WORKSPACE_CUDNN, e->ws_bytes, &ws, &held);
    if (s != DEFT_OK) return s;
    if (held < e->ws_bytes)
        return deft_catt_refuse(n, "the plan needs %zu bytes of workspace and this stream's cuDNN scratch holds %zu%s",
                                e->ws_bytes, held,
                                deft_catt_capturing(st) ? " (it cannot grow inside a capture)" : "");
    deft_catt_pack p;
    deft_catt_pack_of(n, e, out, in, &p);
    if (!deft_catt_aligned(&p))
        return deft_catt_refuse(n, "a tensor's address is not aligned to %d bytes", DEFT_CATT_ALIGN);
    return deft_catt_execute(n, h, e, &p, ws);
}

extern "C" deft_status deft_cudnn_attention_flags(const deft_tensor *n, void *out, const void *const *in,
                                                  cudaStream_t st, unsigned flags) {
    char why[192];
    if (!deft_catt_check(n, why, sizeof why)) return deft_catt_refuse(n, "%s", why);
    int dev = 0;
    const cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return deft_set_error(DEFT_ERR_RUNTIME, "cuda %s: cudaGetDevice failed: %s", deft_op_name(n->op),
                              cudaGetErrorString(ce));
    }
    if (dev < 0 || dev >= DEFT_CATT_MAX_DEVICES)
        return deft_catt_refuse(n, "cuda:%d is past the %d devices this file keeps handles for", dev,
                                DEFT_CATT_MAX_DEVICES);
    return deft_catt_run(n, out, in, st, dev, flags);
}

/* Builds n's plan now, on `st`'s device, without running it: the cache then has it before any run. A problem cuDNN
 * refuses is remembered, as a run would remember it, and is no error here (the run takes deft's kernels). */
extern "C" deft_status deft_cudnn_attention_prepare(const deft_tensor *n, cudaStream_t st, unsigned flags) {
    char why[192];
    int dev = 0;
    if (!deft_catt_check(n, why, sizeof why)) return DEFT_OK;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= DEFT_CATT_MAX_DEVICES) {
        (void)cudaGetLastError();
        return DEFT_OK;   /* the run says why */
    }
    std::lock_guard<std::mutex> guard(deft_catt_locks[dev]);
    deft_catt_entry *e = NULL;
    const deft_status s = deft_catt_entry_for(n, deft_catt_key_of(n, dev, (flags & DEFT_CUDA_DETERMINISTIC) != 0), st, &e);
    return s == DEFT_CUDNN_ATTENTION_REFUSED ? DEFT_OK : s;
}

extern "C" int deft_cudnn_attention_describe(const deft_tensor *n, unsigned flags, char *buf, size_t cap) {
    if (!cap) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
    const deft_catt_entry *e =
        deft_catt_check(n, buf, cap) ? deft_catt_find(deft_catt_key_of(n, dev, (flags & DEFT_CUDA_DETERMINISTIC) != 0))
                                     : NULL;
    if (!e) {
        snprintf(buf, cap, "%s", deft_catt_refusal);
        return 0;
    }
    const deft_catt_key &k = e->key;
    snprintf(buf, cap, "cuDNN attention plan: cuda:%d %s %s B %lld H %lld T %lld D %lld%s%s%s: engine %lld "
             "(heuristics mode %d, candidate %d, graph form %d%s%s), workspace %lld bytes%s, %zu bytes in all", k.dev,
             deft_dtype_name((deft_dtype)k.dtype), k.forward ? "forward" : "backward", (long long)k.b, (long long)k.h,
             (long long)k.t, (long long)k.d, k.causal ? " causal" : "", k.deterministic ? " deterministic" : "",
             k.packed ? " packed" : "",
             (long long)e->plan.engine, e->plan.heur_mode, e->plan.candidate, e->variant,
             e->plan.runtime_compiled ? ", runtime compiled" : "",
             e->plan.nondeterministic ? ", nondeterministic" : "", (long long)e->plan.workspace,
             e->accum ? " + the f32 dq accumulator in the node's buffer" : "", e->ws_bytes);
    return 1;
}

extern "C" void deft_cudnn_attention_release(int dev) {
    if (dev < 0 || dev >= DEFT_CATT_MAX_DEVICES) return;
    std::lock_guard<std::mutex> guard(deft_catt_locks[dev]);
    {
        std::lock_guard<std::mutex> table(deft_catt_table_lock);
        int kept = 0;
        for (int i = 0; i < deft_catt_count; i++) {
            deft_catt_entry *e = deft_catt_table[i];
            if (e->key.dev != dev) {
                deft_catt_table[kept++] = e;
                continue;
            }
            deft_cg_free(&e->g);
            free(e);
        }
        for (int i = kept; i < deft_catt_count; i++) deft_catt_table[i] = NULL;
        deft_catt_count = kept;
        int left = 0;
        for (int i = 0; i < deft_catt_n_refused; i++)
            if (deft_catt_refusals[i].key.dev != dev) deft_catt_refusals[left++] = deft_catt_refusals[i];
        deft_catt_n_refused = left;
    }
    if (deft_catt_handles[dev] && cudnnDestroy(deft_catt_handles[dev]) != CUDNN_STATUS_SUCCESS)
        (void)cudaGetLastError();
    deft_catt_handles[dev] = NULL;
}

#endif

extern "C" deft_status deft_cudnn_attention(const deft_tensor *n, void *out, const void *const *in,
                                            cudaStream_t st) {
    return deft_cudnn_attention_flags(n, out, in, st, DEFT_CUDA_DETERMINISTIC);
}
