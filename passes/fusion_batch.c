/* Batches of products. An MLP's weight gradients are products of one shape that only the optimizer reads. Each is too
 * small to fill a GPU (the mid MLP's 1024 x 1024 outputs are 64 tiles of 128 x 128, under one wave of the device's
 * SMs), and one cuBLASLt call over several of them took less than the calls one by one, and so did the mid MLP's
 * step (bench/RESULTS.md, "Ninth round"). So the products of one device, dtype, shape and transposes that nothing reads
 * before the last of them has run become a group that runs at the last one's step, with the bias gradients that
 * would have been their epilogues (ops/cuda/cuda_matmul.h's deft_cuda_matmul_batch). Their inputs then live until that step: a few activations and
 * output gradients more at the end of the backward pass. Products that fill the GPU by themselves gain nothing and
 * would only keep their inputs longer, so only the ones with fewer output elements than a wave of tiles take part. */
#include <stdlib.h>

#include "cuda_matmul.h"
#include "cuda_tuning.h"
#include "device_internal.h"
#include "fused.h"
#include "fusion_internal.h"

#ifdef DEFT_HAVE_CUDA
/* The most output elements of a product taken into a batch: no more tiles (DEFT_BATCH_TILE_ELEMENTS) than one wave of
 * the device's SMs holds, the SM count rounded down to a power of two (132 SMs: 128 tiles, 2^21 elements). */
static int64_t deft_batch_max_output(int dev) {
    const int sms = deft_cuda_sm_count(dev);
    int64_t tiles = 1;
    while (tiles * 2 <= sms) tiles *= 2;
    return tiles * DEFT_BATCH_TILE_ELEMENTS;
}

static const deft_tensor *deft_batch_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

/* Below DEFT_BATCH_MIN_FLOPS (cuda_tuning.h) a product's launch, not its arithmetic, is what a batch would save, and
 * the small-product kernels (cuda_matmul_small.cu) take it. A product whose operands outweigh its output (a head's
 * weight gradient over a block of rows of logits) stays where it is: held back, it would keep them alive for longer
 * than the launches it saves are worth, and undo an order that frees each block as it goes (plan/schedule_order.c). */
static bool deft_batch_candidate(const deft_fusion *f, int m) {
    const deft_tensor *mm = deft_batch_node(f, m);
    if (mm->op != DEFT_OP_MATMUL || mm->device.type != DEFT_CUDA || !deft_is_step(f, m) || f->group_of[m] >= 0 ||
        f->p->nodes[m].is_output || !deft_cuda_matmul_batchable(mm, mm))
        return false;
    double flops, bytes;
    deft_op_cost(mm, &flops, &bytes);
    const size_t operands = deft_tensor_bytes(mm->src[0]) + deft_tensor_bytes(mm->src[1]);
    return flops >= DEFT_BATCH_MIN_FLOPS && mm->shape[0] * mm->shape[1] <= deft_batch_max_output(mm->device.index) &&
           operands <= deft_tensor_bytes(mm);
}

/* The free bias gradient reading product m's b, -1 if none. */
static int deft_batch_bias_grad(const deft_fusion *f, int m) {
    const deft_tensor *mm = deft_batch_node(f, m);
    if (!deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_BGRAD_B, f->p->cuda_flags)) return -1;
    return deft_find_bias_grad(f, m);
}

/* Whether every reader of node u comes after step `at`. */
static bool deft_batch_read_after(const deft_fusion *f, int u, int at) {
    for (int c = f->cons_start[u]; c < f->cons_start[u + 1]; c++)
        if (f->pos[f->cons[c]] <= at) return false;
    return true;
}

/* Keeps the parts (product mm[i] and bias gradient sum[i], or -1) that nothing reads before the batch's step, the last
 * of theirs; returns how many. Dropping one moves that step no later, so the survivors stay valid. */
static int deft_batch_keep(const deft_fusion *f, int *mm, int *sum, int n) {
    for (bool dropped = true; dropped && n > 1;) {
        int at = -1;
        for (int i = 0; i < n; i++) {
            if (f->pos[mm[i]] > at) at = f->pos[mm[i]];
            if (sum[i] >= 0 && f->pos[sum[i]] > at) at = f->pos[sum[i]];
        }
        int kept = 0;
        for (int i = 0; i < n; i++) {
            if (!deft_batch_read_after(f, mm[i], at) || (sum[i] >= 0 && !deft_batch_read_after(f, sum[i], at)))
                continue;
            mm[kept] = mm[i];
            sum[kept++] = sum[i];
        }
        dropped = kept < n;
        n = kept;
    }
    return n;
}

/* The batch led by the product at step `from`: the free products like it from there on, in step order. */
static deft_status deft_batch_from(deft_fusion *f, int from, int *mm, int *sum) {
    const deft_tensor *first = deft_batch_node(f, f->p->steps[from]);
    int n = 0;
    for (int i = from; i < f->p->n_steps && n < DEFT_MM_BATCH_MAX; i++) {
        const int m = f->p->steps[i];
        if (!deft_batch_candidate(f, m) || !deft_cuda_matmul_batchable(first, deft_batch_node(f, m))) continue;
        mm[n] = m;
        sum[n++] = deft_batch_bias_grad(f, m);
    }
    n = deft_batch_keep(f, mm, sum, n);
    if (n < 2) return DEFT_OK;
    deft_group *g = deft_group_add(f, DEFT_GROUP_MATMUL_BATCH);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = f->p->n_groups - 1;
    g->matmul = mm[0];
    for (int i = 0; i < n; i++) {
        deft_group_join(f, gi, mm[i]);
        if (sum[i] >= 0) deft_group_join(f, gi, sum[i]);
    }
    return DEFT_OK;
}

_Static_assert(2 * DEFT_MM_BATCH_MAX <= DEFT_FUSED_MAX_OPS, "a group's members array holds DEFT_FUSED_MAX_OPS");

deft_status deft_fuse_product_batches(deft_fusion *f) {
    int mm[DEFT_MM_BATCH_MAX], sum[DEFT_MM_BATCH_MAX];
    deft_status s = DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < f->p->n_steps; i++)
        if (deft_batch_candidate(f, f->p->steps[i])) s = deft_batch_from(f, i, mm, sum);
    return s;
}
#else
deft_status deft_fuse_product_batches(deft_fusion *f) {
    (void)f;
    return DEFT_OK;
}
#endif
