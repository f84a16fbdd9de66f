/* The compile option param_copies on the CPU (tests/param_copies_case.h; cuda_test_param_copies.c on a GPU):
 *  1. the MLP under bf16 autocast (SGD with momentum, AdamW, AdamW clipped, two micro-batches per update, optimizer in
 *     backward) and f16 (AdamW clipped, loss scaling) reading its optimizer's persistent copies of the weights gives,
 *     bit for bit, the losses and parameters of the same net casting them, with a weight rewritten by deft_param_set
 *     midway; the copies are read, never computed, replace a cast each, and count as persistent bytes;
 *  2. refusals: without autocast, a value other than 0 and 1, a program of the other precision once copies exist,
 *     and a program reading copies while one compiled without them steps the optimizer (fine once it is freed);
 *  3. a compile that made the copies and then failed (its arena past a memory limit) gives them back. */
#include "param_copies_case.h"

int main(void) {
    pc_suite(deft_cpu());
    return deft_check_finish();
}
