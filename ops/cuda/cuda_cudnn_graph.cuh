/* cuDNN operation graphs built through its C backend API (cudnn_graph.h): descriptors made, set and finalised one
 * call at a time, as cudnn_frontend does inside its graph nodes (its C++ headers are not available to deft). Used by
 * ops/cuda/cuda_attention_cudnn*.cu; only built with cuDNN (DEFT_HAVE_CUDNN).
 *
 * A deft_cg owns every descriptor made for one graph and its execution plan, so that they live exactly as long as
 * the plan (an engine may keep pointers into the graph it was finalised from). The first failing call is kept, with
 * the descriptor and attribute it was setting and cuDNN's own text (cudnnGetLastErrorString), and every later call
 * does nothing: a graph is built straight through and checked once at the end. */
#ifndef DEFT_CUDA_CUDNN_GRAPH_CUH
#define DEFT_CUDA_CUDNN_GRAPH_CUH

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#define DEFT_CG_MAX_DESCS 160   /* descriptors of one graph and its plan (the backward uses about 90) */
#define DEFT_CG_MAX_OPS 40      /* operations of one graph (the backward has 25) */
#define DEFT_CG_WHAT 768        /* bytes of the failure's description */

typedef struct deft_cg {
    cudnnBackendDescriptor_t descs[DEFT_CG_MAX_DESCS];
    int n_descs;
    cudnnBackendDescriptor_t ops[DEFT_CG_MAX_OPS];
    int n_ops;
    cudnnBackendDescriptor_t graph;   /* the finalised operation graph */
    cudnnStatus_t status;             /* of the first failing call */
    char what[DEFT_CG_WHAT];          /* that call, its descriptor and attribute, and cuDNN's text */
} deft_cg;

/* What the chosen execution plan is (for the diagnostics and the workspace). */
typedef struct deft_cg_plan {
    cudnnBackendDescriptor_t plan;   /* owned by the deft_cg */
    int64_t workspace;               /* bytes the plan asks for at execution */
    int64_t engine;                  /* CUDNN_ATTR_ENGINE_GLOBAL_INDEX */
    int heur_mode;                   /* the cudnnBackendHeurMode_t that proposed it */
    int candidate;                   /* its rank among that mode's proposals */
    bool runtime_compiled;           /* CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION */
    bool nondeterministic;           /* CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC */
} deft_cg_plan;

/* Tensor flags. */
#define DEFT_CG_VIRTUAL 1u    /* an intermediate that never reaches memory */
#define DEFT_CG_BY_VALUE 2u   /* a scalar passed by host pointer at execution */

void deft_cg_init(deft_cg *g);
/* Destroys every descriptor g made (plans included); g is empty after. */
void deft_cg_free(deft_cg *g);
static inline bool deft_cg_ok(const deft_cg *g) { return g->status == CUDNN_STATUS_SUCCESS; }

/* A tensor of nd (<= 8) dims and strides, its byte alignment 16. NULL after a failure. */
cudnnBackendDescriptor_t deft_cg_tensor(deft_cg *g, int64_t uid, cudnnDataType_t type, int nd, const int64_t *dim,
                                        const int64_t *stride, unsigned flags, const char *name);
/* y = mode(x[, b[, t]]) computed in `prec`; axis >= 0 for GEN_INDEX only. BINARY_SELECT: y = t ? x : b. */
void deft_cg_pointwise(deft_cg *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                       cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                       int64_t axis, const char *name);
/* c = a b over the last two dims (batched over the others), accumulated in f32. */
void deft_cg_matmul(deft_cg *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                    const char *name);
/* y = op over the dims where y has extent 1 and x does not, computed in f32. */
void deft_cg_reduce(deft_cg *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                    const char *name);
/* y = x seen through y's dims and strides (a view: no data moves). */
void deft_cg_reshape(deft_cg *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *name);
/* Finalises the operation graph of every operation added, in the order added. */
void deft_cg_finish(deft_cg *g, cudnnHandle_t h);

/* The first engine configuration cuDNN's heuristics propose (mode A, then the fallback list) whose execution plan
 * finalises and asks for at most ws_cap bytes of workspace; when `deterministic`, one without cuDNN's nondeterminism
 * note first, else one with it (out->nondeterministic says so). False with g->what saying why (each candidate's
 * refusal) when none serves; g's graph is kept either way. */
bool deft_cg_choose_plan(deft_cg *g, cudnnHandle_t h, bool deterministic, size_t ws_cap, deft_cg_plan *out);

#endif
