/* The compile options resolved once (compile_config.h). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compile_config.h"
#include "cuda_kernels.h"
#include "grad_buckets.h"
#include "pipeline.h"

/* The loss-scale options with GradScaler's defaults filled in; DEFT_ERR_INVALID for one out of range. */
static deft_status deft_resolve_loss_scale(const deft_loss_scale_options *in, deft_loss_scale_options *out) {
    *out = *in;
    if (out->init_scale == 0.0) out->init_scale = 65536.0;
    if (out->growth_factor == 0.0) out->growth_factor = 2.0;
    if (out->backoff_factor == 0.0) out->backoff_factor = 0.5;
    if (out->growth_interval == 0) out->growth_interval = 2000;
    if (!(isfinite(out->init_scale) && out->init_scale > 0.0 && out->init_scale <= FLT_MAX))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.init_scale %g must be finite, > 0 and fit an f32",
                              in->init_scale);
    if (!(isfinite(out->growth_factor) && out->growth_factor > 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.growth_factor %g must be finite and > 1",
                              in->growth_factor);
    if (!(out->backoff_factor > 0.0 && out->backoff_factor < 1.0))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.backoff_factor %g must lie in (0, 1)",
                              in->backoff_factor);
    if (out->growth_interval < 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale.growth_interval %d must be >= 1",
                              in->growth_interval);
    return DEFT_OK;
}

static bool deft_loss_scale_set(const deft_loss_scale_options *o) {
    return o->disable || o->init_scale != 0.0 || o->growth_factor != 0.0 || o->backoff_factor != 0.0 ||
           o->growth_interval != 0;
}

/* The autocast policy and its loss scaling. A scaled step compiled by hand, outside the f16 policy, runs with
 * GradScaler's defaults, so those are resolved whatever the policy. */
static deft_status deft_config_autocast(const deft_compile_options *o, deft_config *c) {
    if (o->autocast != DEFT_F32 && o->autocast != DEFT_BF16 && o->autocast != DEFT_F16)
        return deft_set_error(DEFT_ERR_INVALID,
                              "compile: autocast must be bf16 or f16 (or 0, f32, for off), got %s",
                              (int)o->autocast >= 0 && o->autocast < DEFT_DTYPE_COUNT ? deft_dtype_name(o->autocast)
                                                                                      : "an unknown dtype");
    if (o->autocast != DEFT_F16 && deft_loss_scale_set(&o->loss_scale))
        return deft_set_error(DEFT_ERR_INVALID, "compile: loss_scale options apply to f16 autocast only (autocast is "
                              "%s)", o->autocast == DEFT_F32 ? "off" : deft_dtype_name(o->autocast));
    c->autocast = o->autocast;
    c->loss_scaled = o->autocast == DEFT_F16 && !o->loss_scale.disable;
    return deft_resolve_loss_scale(c->loss_scaled ? &o->loss_scale : &(deft_loss_scale_options){0}, &c->loss_scale);
}

/* The kernels' flags: what each GPU kernel is told at every launch. */
static deft_status deft_config_cuda_flags(const deft_compile_options *o, deft_config *c) {
    if (o->conv_gemm != DEFT_CONV_GEMM_DEFAULT && o->conv_gemm != DEFT_CONV_GEMM_NEVER &&
        o->conv_gemm != DEFT_CONV_GEMM_WITH_F32)
        return deft_set_error(DEFT_ERR_INVALID, "compile: conv_gemm %d is no deft_conv_gemm_mode (0, 1 or 2)",
                              o->conv_gemm);
    c->cuda_flags = (o->tf32 ? DEFT_CUDA_ALLOW_TF32 : 0u) | (o->deterministic ? DEFT_CUDA_DETERMINISTIC : 0u) |
                    (o->conv_gemm == DEFT_CONV_GEMM_NEVER ? DEFT_CUDA_CONV_GEMM_NEVER : 0u) |
                    (o->conv_gemm == DEFT_CONV_GEMM_WITH_F32 ? DEFT_CUDA_CONV_GEMM_F32 : 0u) |
                    (o->cudnn_find ? DEFT_CUDA_CUDNN_FIND : 0u) | (o->matmul_find ? DEFT_CUDA_MATMUL_FIND : 0u);
    return DEFT_OK;
}

/* ZeRO-1 shards the optimizers of a data parallel replica; a step in pieces (optimizer in backward, or per bucket)
 * would update parameters before every gradient reached its owner and the whole norm is known. */
static deft_status deft_config_zero(const deft_compile_options *o, deft_config *c) {
    if (o->zero_stage != 0 && o->zero_stage != 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage %d: only 0 (plain data parallel) and 1 (ZeRO-1: "
                              "the optimizer state sharded) exist", o->zero_stage);
    if (o->zero_stage == 1 && o->optimizer_in_backward)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1 with optimizer_in_backward: a sharded step "
                              "runs whole, once every gradient is reduced to its owner");
    if (o->zero_stage == 1 && o->dist_bucket_pieces)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1 with dist_bucket_pieces: a sharded step runs "
                              "whole, once every gradient is reduced to its owner");
    if (o->zero_stage == 1 && !o->dist)
        return deft_set_error(DEFT_ERR_INVALID, "compile: zero_stage 1 shards the optimizer across the ranks of a "
                              "dist: give the option dist too");
    c->zero_stage = o->zero_stage;
    return DEFT_OK;
}

/* The dtype data parallel averages the gradients in: f32, or under bf16 autocast the weights' own bf16 ones. */
static deft_status deft_config_reduce_dtype(const deft_compile_options *o, deft_config *c) {
    if (o->dist_reduce_dtype == DEFT_F32) return DEFT_OK;
    const char *name = (int)o->dist_reduce_dtype >= 0 && o->dist_reduce_dtype < DEFT_DTYPE_COUNT
                           ? deft_dtype_name(o->dist_reduce_dtype)
                           : "an unknown dtype";
    if (o->dist_reduce_dtype != DEFT_BF16)
        return deft_set_error(DEFT_ERR_INVALID, "compile: dist_reduce_dtype must be f32 (0) or bf16, got %s", name);
    if (!o->dist || c->autocast != DEFT_BF16)
        return deft_set_error(DEFT_ERR_INVALID, "compile: dist_reduce_dtype bf16 averages the bf16 gradients of a "
                              "data-parallel replica under bf16 autocast; give dist and autocast bf16 too");
    if (c->zero_stage)
        return deft_set_error(DEFT_ERR_INVALID, "compile: dist_reduce_dtype bf16 does not work with zero_stage 1 yet: "
                              "the slices' owners receive their gradients in the optimizer's f32");
    c->dist_bf16_grads = true;
    return DEFT_OK;
}

static deft_status deft_config_stop(const deft_compile_options *o, deft_config *c) {
    const int n = deft_pipeline_stage_count();
    c->last_stage = n - 1;
    if (!o->stop_after) return DEFT_OK;
    c->last_stage = deft_pipeline_stage_find(o->stop_after);
    if (c->last_stage >= 0) return DEFT_OK;
    char names[256] = "";
    for (int i = 0; i < n; i++) {
        if (i > 0) strncat(names, ", ", sizeof names - strlen(names) - 1);
        strncat(names, deft_pipeline_stage_name(i), sizeof names - strlen(names) - 1);
    }
    return deft_set_error(DEFT_ERR_INVALID, "compile: stop_after \"%s\" names no stage; the stages are %s",
                          o->stop_after, names);
}

/* The optimizers' low-precision parameter copies read in place of casts: a question for autocast alone. */
static deft_status deft_config_param_copies(const deft_compile_options *o, deft_config *c) {
    if (!o->param_copies) return DEFT_OK;
    if (o->param_copies != 1)
        return deft_set_error(DEFT_ERR_INVALID, "compile: param_copies must be 0 or 1, got %d", o->param_copies);
    if (c->autocast == DEFT_F32)
        return deft_set_error(DEFT_ERR_INVALID, "compile: param_copies keeps the parameters' low-precision copies "
                              "of autocast; set autocast to bf16 or f16 too");
    c->param_copies = true;
    return DEFT_OK;
}

bool deft_config_tight_memory(const deft_config *c) {
    return c->optimizer_in_backward || c->memory_budget || c->checkpoint;
}

deft_status deft_config_resolve(const deft_compile_options *opts, deft_config *out) {
    const deft_compile_options none = {0}, *o = opts ? opts : &none;
    deft_config c = {
        .memory_budget = o->memory_budget,
        .no_reuse = o->no_reuse,
        .reorder = o->reorder,
        .checkpoint = o->checkpoint,
        .checkpoint_segments = o->checkpoint_segments,
        .optimizer_in_backward = o->optimizer_in_backward,
        .dist = o->dist,
        .dist_local = o->dist_local,
        .bucket_bytes = o->bucket_bytes ? o->bucket_bytes : DEFT_BUCKET_DEFAULT_BYTES,
        .last_bucket_bytes = o->last_bucket_bytes ? o->last_bucket_bytes : DEFT_LAST_BUCKET_DEFAULT_BYTES,
        .split_per_bucket = o->dist && o->dist_bucket_pieces && !o->optimizer_in_backward,
        .fusion = !o->no_fusion,
        .fold_relu_grad = !o->no_relu_grad_fold,
        .cheap_recompute = !o->no_cheap_recompute,
        .fuse_low_precision = o->fuse_low_precision,
        .cuda_graphs = !o->no_cuda_graphs,
    };
    /* Both keep inputs alive past the plan; batches also make gradients ready all at once, which a replica's buckets
     * (all-reduced as their gradients become ready) would wait for. */
    c.product_batches = !o->no_product_batches && !o->dist && !deft_config_tight_memory(&c);
    c.side_lane = !o->no_side_lane && !deft_config_tight_memory(&c);
    deft_status s = deft_config_autocast(o, &c);
    if (s == DEFT_OK) s = deft_config_zero(o, &c);
    if (s == DEFT_OK) s = deft_config_param_copies(o, &c);
    if (s == DEFT_OK) s = deft_config_reduce_dtype(o, &c);
    if (s == DEFT_OK) s = deft_config_cuda_flags(o, &c);
    if (s == DEFT_OK) s = deft_config_stop(o, &c);
    if (s == DEFT_OK) *out = c;
    return s;
}
