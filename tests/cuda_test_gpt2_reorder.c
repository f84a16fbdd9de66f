/* GPT-2 (examples/gpt2.h) on a GPU with its loss in row blocks, compiled with the option reorder against the given
 * order, with and without the side lane: the loss (eager and replayed) is the same bits, and so is every parameter's
 * gradient in f32; under bf16 autocast a bias gradient may be summed by its product's epilogue in one order and by a
 * sum of its own in the other (passes/fusion.c fuses the two only where no reader comes between), which rounds
 * differently, so there the gradients agree within 1 % of each one's largest magnitude. Under bf16 the reordered
 * arena is smaller (each block's logits die after its gradient has gone through the head's products,
 * plan/schedule_order.c). In f32 at this size the GPU's plan of the reordered steps is not smaller (on the CPU it
 * is), so the compile keeps the given order (passes/pipeline.c decides on plans run to the end) and the arena must
 * only be no larger. On a GPU the reordered steps go through fusion, the side lane and a CUDA Graph capture, which
 * the CPU's test_gpt2_loss_chunks does not exercise. */
#include "../examples/gpt2.h"
#include "check.h"
#include "gpt2_grads.h"

static const gpt2_config cfg = {4096, 64, 64, 2, 4};

static void compare(deft_dtype autocast, int no_side_lane, const char *what) {
    gpt2_grads re, given;
    const deft_compile_options o = {.autocast = autocast, .no_side_lane = no_side_lane};
    deft_compile_options ro = o;
    ro.reorder = 1;
    gpt2_grads_run(&cfg, 4, 4, deft_cuda(0), &ro, &re);
    gpt2_grads_run(&cfg, 4, 4, deft_cuda(0), &o, &given);
    if (autocast == DEFT_BF16)
        CHECK_MSG(re.arena < given.arena, "%s: arena %zu reordered, %zu in order", what, re.arena, given.arena);
    else
        CHECK_MSG(re.arena <= given.arena, "%s: arena %zu reordered, %zu in order", what, re.arena, given.arena);
    if (autocast == DEFT_F32) gpt2_grads_same(&re, &given, what);
    else gpt2_grads_close(&re, &given, 1e-2, what);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    compare(DEFT_F32, 1, "f32");
    compare(DEFT_BF16, 1, "bf16");
    compare(DEFT_F32, 0, "f32, side lane");
    compare(DEFT_BF16, 0, "bf16, side lane");
    return deft_check_finish();
}
