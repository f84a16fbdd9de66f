/* GPT-2 (examples/gpt2.h) on a GPU with the cheap recomputations (the default: GELU outputs, permutes and layer
 * norms dropped and made again in the backward pass, passes/checkpoint_policy.c) against keeping every value
 * (no_cheap_recompute): the loss and every parameter's gradient are the same bits, in f32 and under bf16 autocast, every
 * layer norm is made again, and the planned activation bytes fall.
 * On a GPU a recomputed layer norm runs alone where the forward pass ran it fused with the residual add before it
 * (passes/fusion_layer_norm.c): the two kernels must round the normalised value alike. */
#include "../examples/gpt2.h"
#include "check.h"
#include "gpt2_grads.h"

static const gpt2_config cfg = {512, 64, 64, 2, 4};

static void compare(deft_dtype autocast, const char *what) {
    gpt2_grads cheap, kept;
    gpt2_grads_run(&cfg, 4, 1, deft_cuda(0), &(deft_compile_options){.autocast = autocast}, &cheap);
    gpt2_grads_run(&cfg, 4, 1, deft_cuda(0), &(deft_compile_options){.autocast = autocast, .no_cheap_recompute = 1},
                   &kept);
    /* Each block's two layer norms and the final one, at the least (and the GELU outputs). */
    CHECK_MSG(cheap.dropped >= kept.dropped + 2 * cfg.layers + 1 && cheap.activation_bytes < kept.activation_bytes,
              "%s: %d dropped (%d keeping), activation bytes %zu (%zu keeping)", what, cheap.dropped, kept.dropped,
              cheap.activation_bytes, kept.activation_bytes);
    gpt2_grads_same(&cheap, &kept, what);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    compare(DEFT_F32, "f32");
    compare(DEFT_BF16, "bf16");
    return deft_check_finish();
}
