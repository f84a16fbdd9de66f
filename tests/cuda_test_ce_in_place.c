/* Cross-entropy's gradient written over its logits on a GPU (tests/ce_in_place.h), through each of its kernels: a
 * warp per row (300 classes), a block per row holding the row in registers (4096 classes; 50304 in bf16), and the
 * plain block kernels (the CE_REFERENCE debug knob, and rows too long for registers). Each must share the logits'
 * buffer, keep the arena under twice the logits, and give the bits of the program whose logits stay an output. */
#include "ce_in_place.h"

static const ce_ip_case cases[] = {
    {"f32, 300 classes (a warp per row), plain mean", DEFT_F32, 64, 8, 300, 0, {0}, 0},
    {"bf16, 300 classes, ignore -100 every 3rd, smoothing 0.1", DEFT_BF16, 64, 8, 300, 1,
     {.use_ignore_index = 1, .ignore_index = -100, .label_smoothing = 0.1}, 3},
    {"f32, 4096 classes, sum", DEFT_F32, 32, 4, 4096, 1, {.reduction = DEFT_REDUCTION_SUM}, 0},
    {"bf16, 4095 classes, ignore 2 every 2nd, smoothing 0.2", DEFT_BF16, 32, 4, 4095, 1,
     {.use_ignore_index = 1, .ignore_index = 2, .label_smoothing = 0.2}, 2},
    {"f16, 50304 classes, plain mean", DEFT_F16, 16, 2, 50304, 0, {0}, 0},
    {"bf16, 50257 classes, ignore -100 every 4th", DEFT_BF16, 16, 2, 50257, 1,
     {.use_ignore_index = 1, .ignore_index = -100}, 4},
    {"bf16, 70001 classes (the plain kernels), sum", DEFT_BF16, 8, 2, 70001, 1, {.reduction = DEFT_REDUCTION_SUM},
     0},
};

int main(void) {
    deft_device dev;
    if (!deft_test_gpu(&dev)) return DEFT_CHECK_SKIP;
    for (int reference = 0; reference < 2; reference++) {
        CHECK_OK(deft_testing_set_debug("CE_REFERENCE", reference));
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            ce_ip_check(dev, reference ? "gpu (plain kernels)" : "gpu", &cases[i]);
    }
    CHECK_OK(deft_testing_set_debug("CE_REFERENCE", 0));
    return deft_check_finish();
}
