/* cuDNN operation graphs through the backend API (cuda_cudnn_graph.cuh says how failures are kept). Each attribute
 * is set with the element type cudnn_graph.h documents for it: enums by their own CUDNN_TYPE_*, counts and uids as
 * int64_t, flags as C++ bool (CUDNN_TYPE_BOOLEAN), descriptors as arrays of cudnnBackendDescriptor_t. */
#ifdef DEFT_HAVE_CUDNN

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda_cudnn_graph.cuh"

#define DEFT_CG_CANDIDATES 8   /* engine configurations asked of each heuristic mode */

void deft_cg_init(deft_cg *g) {
    memset(g, 0, sizeof *g);
    g->status = CUDNN_STATUS_SUCCESS;
}

void deft_cg_free(deft_cg *g) {
    for (int i = g->n_descs - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->descs[i]);
    deft_cg_init(g);
}

/* Appends printf-style text to buf (cap bytes), never past its end. */
static void deft_cg_append(char *buf, size_t cap, const char *fmt, ...) {
    const size_t used = strlen(buf);
    if (used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

/* cuDNN's own description of the last failure on this thread. */
static void deft_cg_last_error(char *buf, size_t cap) {
    buf[0] = '\0';
    cudnnGetLastErrorString(buf, cap);
    if (!buf[0]) snprintf(buf, cap, "(no message)");
}

/* Records the first failure: what was being done, the status, and cuDNN's text. */
static void deft_cg_fail(deft_cg *g, cudnnStatus_t s, const char *what) {
    if (!deft_cg_ok(g)) return;
    char last[384];
    deft_cg_last_error(last, sizeof last);
    g->status = s;
    snprintf(g->what, sizeof g->what, "%s: %s (status %d); cuDNN says: %s", what, cudnnGetErrorString(s), (int)s,
             last);
}

static cudnnBackendDescriptor_t deft_cg_make(deft_cg *g, cudnnBackendDescriptorType_t type, const char *name) {
    if (!deft_cg_ok(g)) return NULL;
    char what[160];
    if (g->n_descs == DEFT_CG_MAX_DESCS) {
        snprintf(what, sizeof what, "%s: more than %d descriptors in one graph", name, DEFT_CG_MAX_DESCS);
        deft_cg_fail(g, CUDNN_STATUS_BAD_PARAM, what);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    const cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(what, sizeof what, "%s: cudnnBackendCreateDescriptor(type %d)", name, (int)type);
        deft_cg_fail(g, s, what);
        return NULL;
    }
    g->descs[g->n_descs++] = d;
    return d;
}

static void deft_cg_set_(deft_cg *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                         cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *attr_name,
                         const char *name) {
    if (!deft_cg_ok(g) || !d) return;
    const cudnnStatus_t s = cudnnBackendSetAttribute(d, attr, type, count, value);
    if (s == CUDNN_STATUS_SUCCESS) return;
    char what[192];
    snprintf(what, sizeof what, "%s: SetAttribute %s (%lld elements)", name, attr_name, (long long)count);
    deft_cg_fail(g, s, what);
}
#define DEFT_CG_SET(g, d, attr, type, count, value, name) deft_cg_set_(g, d, attr, type, count, value, #attr, name)

static void deft_cg_finalize(deft_cg *g, cudnnBackendDescriptor_t d, const char *name) {
    if (!deft_cg_ok(g) || !d) return;
    const cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s == CUDNN_STATUS_SUCCESS) return;
    char what[160];
    snprintf(what, sizeof what, "%s: cudnnBackendFinalize", name);
    deft_cg_fail(g, s, what);
}

static void deft_cg_add_op(deft_cg *g, cudnnBackendDescriptor_t op, const char *name) {
    if (!deft_cg_ok(g) || !op) return;
    if (g->n_ops == DEFT_CG_MAX_OPS) {
        char what[160];
        snprintf(what, sizeof what, "%s: more than %d operations in one graph", name, DEFT_CG_MAX_OPS);
        deft_cg_fail(g, CUDNN_STATUS_BAD_PARAM, what);
        return;
    }
    g->ops[g->n_ops++] = op;
}

cudnnBackendDescriptor_t deft_cg_tensor(deft_cg *g, int64_t uid, cudnnDataType_t type, int nd, const int64_t *dim,
                                        const int64_t *stride, unsigned flags, const char *name) {
    char label[96];
    snprintf(label, sizeof label, "tensor %s (uid %lld)", name, (long long)uid);
    cudnnBackendDescriptor_t t = deft_cg_make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, label);
    const int64_t alignment = 16;
    const bool yes = true;
    DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, label);
    DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dim, label);
    DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, stride, label);
    DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, label);
    DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, label);
    if (flags & DEFT_CG_VIRTUAL) DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, label);
    if (flags & DEFT_CG_BY_VALUE) DEFT_CG_SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, label);
    deft_cg_finalize(g, t, label);
    return deft_cg_ok(g) ? t : NULL;
}

void deft_cg_pointwise(deft_cg *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                       cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                       int64_t axis, const char *name) {
    char label[96];
    snprintf(label, sizeof label, "pointwise %s (mode %d)", name, (int)mode);
    cudnnBackendDescriptor_t pw = deft_cg_make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, label);
    DEFT_CG_SET(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, label);
    DEFT_CG_SET(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, label);
    if (axis >= 0) DEFT_CG_SET(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, label);
    deft_cg_finalize(g, pw, label);
    cudnnBackendDescriptor_t op = deft_cg_make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, label);
    const float one = 1.0f;   /* y = op(alpha1 x, alpha2 b): both 1, as the frontend sets them */
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, label);
    if (b) DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, label);
    if (t) DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, label);
    deft_cg_finalize(g, op, label);
    deft_cg_add_op(g, op, label);
}

void deft_cg_matmul(deft_cg *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                    const char *name) {
    char label[96];
    snprintf(label, sizeof label, "matmul %s", name);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = deft_cg_make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, label);
    DEFT_CG_SET(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, label);
    deft_cg_finalize(g, mm, label);
    cudnnBackendDescriptor_t op = deft_cg_make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, label);
    deft_cg_finalize(g, op, label);
    deft_cg_add_op(g, op, label);
}

void deft_cg_reduce(deft_cg *g, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                    const char *name) {
    char label[96];
    snprintf(label, sizeof label, "reduction %s (operator %d)", name, (int)red);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = deft_cg_make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, label);
    DEFT_CG_SET(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, label);
    DEFT_CG_SET(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red, label);
#if CUDNN_VERSION >= 91100
    /* the frontend states the default (false) from 9.11 on, where the attribute exists */
    const bool deterministic = false;
    if (cudnnGetVersion() >= 91100)
        DEFT_CG_SET(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, label);
#endif
    deft_cg_finalize(g, rd, label);
    cudnnBackendDescriptor_t op = deft_cg_make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, label);
    deft_cg_finalize(g, op, label);
    deft_cg_add_op(g, op, label);
}

void deft_cg_reshape(deft_cg *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *name) {
    char label[96];
    snprintf(label, sizeof label, "reshape %s", name);
    cudnnBackendDescriptor_t op = deft_cg_make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, label);
    DEFT_CG_SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, label);
    deft_cg_finalize(g, op, label);
    deft_cg_add_op(g, op, label);
}

void deft_cg_finish(deft_cg *g, cudnnHandle_t h) {
    const char *label = "operation graph";
    cudnnBackendDescriptor_t graph = deft_cg_make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, label);
    /* the handle is optional from cuDNN 9.8 on and required before: set it either way */
    DEFT_CG_SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, label);
    DEFT_CG_SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops, label);
    deft_cg_finalize(g, graph, label);
    g->graph = deft_cg_ok(g) ? graph : NULL;
}

/* ---- choosing an execution plan ---- */

/* Reads the engine behind cfg: its global index and notes. */
static cudnnStatus_t deft_cg_engine_of(cudnnBackendDescriptor_t cfg, deft_cg_plan *p) {
    cudnnBackendDescriptor_t engine = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    int64_t got = 0;
    s = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &engine);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &p->engine);
    cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t n_numerical = 0, n_behavior = 0;
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_numerical, numerical);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n_behavior, behavior);
    for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < n_numerical && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
        if (numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) p->nondeterministic = true;
    for (int64_t i = 0; s == CUDNN_STATUS_SUCCESS && i < n_behavior && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
        if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) p->runtime_compiled = true;
    cudnnBackendDestroyDescriptor(engine);
    return s;
}

/* The execution plan of cfg, or NULL with the reason appended to why. */
static cudnnBackendDescriptor_t deft_cg_try_config(cudnnHandle_t h, cudnnBackendDescriptor_t cfg, bool deterministic,
                                                   size_t ws_cap, deft_cg_plan *p, char *why, size_t cap) {
    char last[384];
    cudnnStatus_t s = deft_cg_engine_of(cfg, p);
    if (s != CUDNN_STATUS_SUCCESS) {
        deft_cg_last_error(last, sizeof last);
        deft_cg_append(why, cap, " [candidate %d: reading its engine: %s; %s]", p->candidate, cudnnGetErrorString(s),
                       last);
        return NULL;
    }
    if (deterministic && p->nondeterministic) {
        deft_cg_append(why, cap, " [engine %lld: nondeterministic]", (long long)p->engine);
        return NULL;
    }
    cudnnBackendDescriptor_t plan = NULL;
    s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &cfg);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan);
    int64_t got = 0, ws = 0;
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
    if (s != CUDNN_STATUS_SUCCESS) {
        deft_cg_last_error(last, sizeof last);
        deft_cg_append(why, cap, " [engine %lld: execution plan: %s (status %d); %s]", (long long)p->engine,
                       cudnnGetErrorString(s), (int)s, last);
    } else if (ws < 0 || (uint64_t)ws > (uint64_t)ws_cap) {
        deft_cg_append(why, cap, " [engine %lld: asks %lld bytes of workspace, past the %zu this stream may hold]",
                       (long long)p->engine, (long long)ws, ws_cap);
        s = CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (s != CUDNN_STATUS_SUCCESS) {
        if (plan) cudnnBackendDestroyDescriptor(plan);
        return NULL;
    }
    p->workspace = ws;
    return plan;
}

/* Descriptors made outside deft_cg_make, handed to g (destroyed with it); false, with d destroyed, when g is full. */
static bool deft_cg_adopt(deft_cg *g, cudnnBackendDescriptor_t d) {
    if (g->n_descs == DEFT_CG_MAX_DESCS) {
        cudnnBackendDestroyDescriptor(d);
        return false;
    }
    g->descs[g->n_descs++] = d;
    return true;
}

/* The heuristic's proposals for one mode, tried in its order; true with *out filled on the first that serves. */
static bool deft_cg_try_mode(deft_cg *g, cudnnHandle_t h, cudnnBackendHeurMode_t mode, bool deterministic,
                             size_t ws_cap, deft_cg_plan *out, char *why, size_t cap) {
    char last[384];
    cudnnBackendDescriptor_t heur = NULL, cfgs[DEFT_CG_CANDIDATES] = {NULL};
    int64_t count = 0, got = 0, made = 0;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &g->graph);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(heur);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                     NULL);
    for (; s == CUDNN_STATUS_SUCCESS && made < count && made < DEFT_CG_CANDIDATES; made++)
        s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made]);
    if (s == CUDNN_STATUS_SUCCESS && made > 0)
        s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got,
                                     cfgs);
    if (s != CUDNN_STATUS_SUCCESS) {
        deft_cg_last_error(last, sizeof last);
        deft_cg_append(why, cap, " [heuristics mode %d: %s (status %d); %s]", (int)mode, cudnnGetErrorString(s),
                       (int)s, last);
    } else if (got == 0) {
        deft_cg_append(why, cap, " [heuristics mode %d: no engine proposed]", (int)mode);
    }
    int chosen = -1;
    cudnnBackendDescriptor_t plan = NULL;
    for (int i = 0; s == CUDNN_STATUS_SUCCESS && i < got && i < made && !plan; i++) {
        deft_cg_plan p;
        memset(&p, 0, sizeof p);
        p.engine = -1, p.heur_mode = (int)mode, p.candidate = i;
        plan = deft_cg_try_config(h, cfgs[i], deterministic, ws_cap, &p, why, cap);
        if (plan) *out = p, chosen = i;
    }
    /* keep what the plan was made from (the configuration, and the heuristic that made it) */
    bool kept = true;
    for (int i = 0; i < made; i++)
        if (i == chosen) kept = deft_cg_adopt(g, cfgs[i]) && kept;
        else if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (heur && chosen >= 0) kept = deft_cg_adopt(g, heur) && kept;
    else if (heur) cudnnBackendDestroyDescriptor(heur);
    if (plan) kept = deft_cg_adopt(g, plan) && kept;
    if (plan && !kept) {
        deft_cg_append(why, cap, " [more than %d descriptors]", DEFT_CG_MAX_DESCS);
        return false;
    }
    if (plan) out->plan = plan;
    return plan != NULL;
}

bool deft_cg_choose_plan(deft_cg *g, cudnnHandle_t h, bool deterministic, size_t ws_cap, deft_cg_plan *out) {
    memset(out, 0, sizeof *out);
    if (!deft_cg_ok(g) || !g->graph) return false;
    char why[DEFT_CG_WHAT];
    why[0] = '\0';
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2; m++)
        if (deft_cg_try_mode(g, h, modes[m], deterministic, ws_cap, out, why, sizeof why)) return true;
    /* Only engines cuDNN notes as nondeterministic: the graph's own form may still be free of atomics (the
     * frontend asks for determinism on Hopper through the graph alone), so take one, marked as such. */
    for (int m = 0; deterministic && m < 2; m++) {
        if (m == 0) deft_cg_append(why, sizeof why, " then, taking nondeterministic engines:");
        if (deft_cg_try_mode(g, h, modes[m], false, ws_cap, out, why, sizeof why)) return true;
    }
    g->status = CUDNN_STATUS_NOT_SUPPORTED;
    g->what[0] = '\0';
    deft_cg_append(g->what, sizeof g->what, "no engine runs the graph:");
    deft_cg_append(g->what, sizeof g->what, "%.*s", (int)(sizeof g->what - 32), why);
    return false;
}

#endif
