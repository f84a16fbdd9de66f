/* Timing cuBLASLt's candidate algorithms (cuda_matmul_lt_find.cuh). Each candidate runs once to warm up (its
 * kernels loaded, its caches filled), then DEFT_LT_FIND_RUNS times, each between two events on the product's own
 * stream, and the least of those times is its measure: the least is the one least disturbed by what else the GPU
 * is doing. A refused candidate (CUBLAS_STATUS_NOT_SUPPORTED, or any other refusal before or at launch) is only
 * skipped, since the heuristic offers algorithms that can still fail for a given problem; an error the context
 * keeps is never swallowed, since later work on the stream would fail with it anyway and the caller must see it. */
#include <math.h>

#include "cuda_matmul_lt_find.cuh"

#define DEFT_LT_FIND_RUNS 3

static deft_status deft_lt_find_error(cudaError_t e, const char *what) {
    (void)cudaGetLastError();   /* a non-sticky error is reported here, not again by the next launch check */
    return deft_set_error(DEFT_ERR_RUNTIME, "cuda matmul_find: %s: %s", what, cudaGetErrorString(e));
}

/* After a candidate's failed call: a launch error CUDA does not keep was that candidate's alone, and is cleared; an
 * error the stream still reports is real. */
static deft_status deft_lt_find_skip(cudaStream_t st) {
    (void)cudaGetLastError();
    const cudaError_t e = cudaStreamQuery(st);
    if (e == cudaSuccess || e == cudaErrorNotReady) return DEFT_OK;
    return deft_lt_find_error(e, "the stream after a refused candidate");
}

static cublasStatus_t deft_lt_find_run(const deft_lt_find_problem &p, const cublasLtMatmulAlgo_t *algo, void *ws,
                                       size_t room) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(p.h, p.desc, &one, p.A, p.la, p.B, p.lb, &zero, p.D, p.ld, p.D, p.ld, algo,
                          room ? ws : NULL, room, p.st);
}

/* One candidate's least time over DEFT_LT_FIND_RUNS runs in *ms; *ran = false where it was skipped. */
static deft_status deft_lt_find_one(const deft_lt_find_problem &p, const cublasLtMatmulAlgo_t *algo, void *ws,
                                    size_t room, cudaEvent_t start, cudaEvent_t stop, float *ms, bool *ran) {
    *ran = false;
    *ms = INFINITY;
    if (deft_lt_find_run(p, algo, ws, room) != CUBLAS_STATUS_SUCCESS) return deft_lt_find_skip(p.st);
    for (int r = 0; r < DEFT_LT_FIND_RUNS; r++) {
        cudaError_t e = cudaEventRecord(start, p.st);
        if (e != cudaSuccess) return deft_lt_find_error(e, "cudaEventRecord");
        if (deft_lt_find_run(p, algo, ws, room) != CUBLAS_STATUS_SUCCESS) return deft_lt_find_skip(p.st);
        if ((e = cudaEventRecord(stop, p.st)) != cudaSuccess) return deft_lt_find_error(e, "cudaEventRecord");
        if ((e = cudaEventSynchronize(stop)) != cudaSuccess) return deft_lt_find_error(e, "a candidate's run");
        float t = 0.0f;
        if ((e = cudaEventElapsedTime(&t, start, stop)) != cudaSuccess)
            return deft_lt_find_error(e, "cudaEventElapsedTime");
        *ms = fminf(*ms, t);
    }
    *ran = true;
    return DEFT_OK;
}

deft_status deft_lt_time_candidates(const deft_lt_find_problem &p, const cublasLtMatmulAlgo_t *algo,
                                    const size_t *ws_need, int n, void *ws, size_t room, int *best) {
    *best = -1;
    cudaEvent_t start = NULL, stop = NULL;
    cudaError_t e = cudaEventCreate(&start);
    if (e != cudaSuccess) start = NULL;
    else if ((e = cudaEventCreate(&stop)) != cudaSuccess) stop = NULL;   /* start is destroyed below */
    deft_status s = e == cudaSuccess ? DEFT_OK : deft_lt_find_error(e, "cudaEventCreate");
    float best_ms = INFINITY;
    for (int i = 0; s == DEFT_OK && i < n; i++) {
        if (ws_need[i] > room) continue;   /* the room the call holds bounds what may be timed */
        float ms = INFINITY;
        bool ran = false;
        s = deft_lt_find_one(p, &algo[i], ws, room, start, stop, &ms, &ran);
        if (s == DEFT_OK && ran && ms < best_ms) {
            best_ms = ms;
            *best = i;
        }
    }
    cudaEvent_t evs[2] = {start, stop};
    for (cudaEvent_t ev : evs) {
        if (!ev) continue;
        const cudaError_t d = cudaEventDestroy(ev);
        if (d != cudaSuccess && s == DEFT_OK) s = deft_lt_find_error(d, "cudaEventDestroy");
    }
    if (s != DEFT_OK) *best = -1;
    return s;
}
