/* cuDNN's fused attention: what the graph builder (cuda_attention_cudnn_graph.cu) and the runner
 * (cuda_attention_cudnn.cu) share. Only built with cuDNN (DEFT_HAVE_CUDNN). */
#ifndef DEFT_CUDA_ATTENTION_CUDNN_CUH
#define DEFT_CUDA_ATTENTION_CUDNN_CUH

#include "cuda_cudnn_graph.cuh"

/* The unique ids of the tensors that reach memory (the variant pack's keys) and of the by-value scalars; virtual
 * tensors take ids from DEFT_CATT_UID_VIRTUAL on. */
enum {
    DEFT_CATT_UID_Q = 1,
    DEFT_CATT_UID_K,       /* k, described as its transpose [B, H, D, T] */
    DEFT_CATT_UID_V,       /* v (as [B, H, D, T] in the backward) */
    DEFT_CATT_UID_O,       /* the forward's output (written forward, read backward) */
    DEFT_CATT_UID_STATS,   /* log-sum-exp of each row of scale q k^T, f32 [B, H, T, 1] */
    DEFT_CATT_UID_DO,
    DEFT_CATT_UID_DQ,
    DEFT_CATT_UID_DK,
    DEFT_CATT_UID_DV,
    DEFT_CATT_UID_DELTA,   /* backward: rowsum(dO * O), f32 [B, H, T, 1], in the gradient node's scratch */
    DEFT_CATT_UID_ACCUM,   /* backward without determinism: dq accumulated in f32 [B, H, T, D], in the workspace */
    DEFT_CATT_UID_SCALE,   /* by value: the scale of the scores */
    DEFT_CATT_UID_NEG_INF, /* by value: what masked scores become */
    DEFT_CATT_UID_ONE,     /* by value: 1 (the frontend's dropout-free scale of delta) */
    DEFT_CATT_UID_VIRTUAL = 100
};

typedef struct deft_catt_shape {
    int64_t b, h, t, d;
    cudnnDataType_t io;   /* CUDNN_DATA_HALF or CUDNN_DATA_BFLOAT16 */
    bool forward;
    bool causal;
    bool deterministic;   /* backward: dq straight from a full dS (no f32 atomics) */
    bool packed;          /* q, k, v the thirds of [B, T, 3C] and o [B, T, H, D] (graph_internal.h's
                           * deft_attention_layout_of), else each a row-major [B, H, T, D] */
    int variant;          /* the form of the graph, 0 .. DEFT_CATT_VARIANTS - 1 */
} deft_catt_shape;

/* Forms of the graph, tried in turn until cuDNN takes one: 0 is the frontend's own lowering; 1 differs where that
 * lowering is least certain to be what cuDNN 9.19 matches (the causal mask's indices computed in int32 rather than
 * f32, and the backward's view of k in the io dtype rather than f32). */
#define DEFT_CATT_VARIANTS 2

/* Builds and finalises the operation graph of s (forward or backward) into g; false with g->what on a refusal. */
bool deft_catt_build_graph(deft_cg *g, cudnnHandle_t h, const deft_catt_shape *s);

#endif
