/* Test support for CUDA kernels called directly: cuBLASLt products with epilogues, batches of products, and the fused
 * elementwise kernel's refusals. Descriptions come in deft_testing.h's plain structs and go to the kernels in their
 * own; without CUDA every call answers DEFT_ERR_NO_CUDA. */
#include "deft_testing.h"

#include <string.h>

#include "base.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_matmul.h"
#include "fused.h"

_Static_assert(DEFT_TESTING_MM_NONE == DEFT_MM_EPI_NONE && DEFT_TESTING_MM_BIAS == DEFT_MM_EPI_BIAS &&
                   DEFT_TESTING_MM_BIAS_RELU == DEFT_MM_EPI_BIAS_RELU && DEFT_TESTING_MM_BGRAD_B == DEFT_MM_EPI_BGRAD_B,
               "deft_testing.h's epilogue kinds follow ops/cuda/cuda_matmul.h");

size_t deft_testing_node_extra_offset(const deft_tensor *t) { return deft_node_extra_offset(t); }
size_t deft_testing_node_buffer_bytes(const deft_tensor *t) { return deft_node_buffer_bytes(t); }

#ifdef DEFT_HAVE_CUDA

int deft_testing_matmul_fusable(const deft_tensor *mm, int kind, unsigned flags) {
    return deft_cuda_matmul_fusable(mm, (deft_mm_epilogue_kind)kind, flags);
}

deft_status deft_testing_matmul_fused(const deft_tensor *mm, void *out, const void *a, const void *b,
                                      const deft_testing_mm_epilogue *ep, void *stream, unsigned flags) {
    const deft_mm_epilogue e = {(deft_mm_epilogue_kind)ep->kind, ep->bias, ep->bias_grad};
    return deft_cuda_matmul_fused(mm, out, a, b, &e, stream, flags);
}

deft_status deft_testing_matmul_batch(const deft_testing_mm_part *parts, int n, void *stream, unsigned flags) {
    deft_mm_part p[DEFT_MM_BATCH_MAX];
    memset(p, 0, sizeof p);
    /* A count the kernel refuses goes to it as it is, so the refusal is the kernel's own. */
    if (!parts || n < 1 || n > DEFT_MM_BATCH_MAX) return deft_cuda_matmul_batch(parts ? p : NULL, n, stream, flags);
    for (int i = 0; i < n; i++)
        p[i] = (deft_mm_part){parts[i].mm, parts[i].out, parts[i].a, parts[i].b, parts[i].bias_grad};
    return deft_cuda_matmul_batch(p, n, stream, flags);
}

deft_status deft_testing_fused_relu(deft_dtype input_dtype, int64_t numel) {
    deft_fused_kernel k;
    memset(&k, 0, sizeof k);
    k.n_inputs = 1;
    k.n_ops = 1;
    k.n_stores = 1;
    k.ndim = 1;
    k.numel = k.shape[0] = numel;
    k.input_dtype[0] = input_dtype;
    k.ops[0] = (deft_fused_instr){.op = DEFT_OP_RELU, .a = 0, .b = 0, .dtype = DEFT_F32};
    k.store_reg[0] = 1;
    k.store_dtype[0] = DEFT_F32;
    void *out[1] = {NULL};
    const void *in[1] = {NULL};
    return deft_cuda_fused_run(&k, out, in, NULL);
}

size_t deft_testing_cublas_floor(int device) { return deft_cuda_cublas_floor(device); }

void deft_testing_matmul_find_counts(int64_t *timed, int64_t *kept) { deft_cuda_matmul_find_counts(timed, kept); }

int deft_testing_ce_regs_groups(deft_dtype logits, int64_t classes) { return deft_cuda_ce_regs_groups(logits, classes); }

int deft_testing_ce_streams(deft_dtype logits, int64_t classes) { return deft_cuda_ce_streams(logits, classes); }

#else

int deft_testing_ce_regs_groups(deft_dtype logits, int64_t classes) {
    (void)logits, (void)classes;
    return -1;
}

int deft_testing_ce_streams(deft_dtype logits, int64_t classes) {
    (void)logits, (void)classes;
    return -1;
}

size_t deft_testing_cublas_floor(int device) {
    (void)device;
    return 0;
}

void deft_testing_matmul_find_counts(int64_t *timed, int64_t *kept) {
    *timed = 0;
    *kept = 0;
}

static deft_status deft_testing_no_cuda(const char *what) {
    return deft_set_error(DEFT_ERR_NO_CUDA, "%s: built without CUDA", what);
}

int deft_testing_matmul_fusable(const deft_tensor *mm, int kind, unsigned flags) {
    (void)mm, (void)kind, (void)flags;
    return 0;
}

deft_status deft_testing_matmul_fused(const deft_tensor *mm, void *out, const void *a, const void *b,
                                      const deft_testing_mm_epilogue *ep, void *stream, unsigned flags) {
    (void)mm, (void)out, (void)a, (void)b, (void)ep, (void)stream, (void)flags;
    return deft_testing_no_cuda("matmul_fused");
}

deft_status deft_testing_matmul_batch(const deft_testing_mm_part *parts, int n, void *stream, unsigned flags) {
    (void)parts, (void)n, (void)stream, (void)flags;
    return deft_testing_no_cuda("matmul_batch");
}

deft_status deft_testing_fused_relu(deft_dtype input_dtype, int64_t numel) {
    (void)input_dtype, (void)numel;
    return deft_testing_no_cuda("fused_relu");
}

#endif
