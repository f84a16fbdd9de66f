/* The packing kernels of data parallel's packed buckets (ops/cuda/cuda_dist_pack.cu), on one GPU: packing gradients
 * at 16-byte aligned offsets and unpacking them restores every byte and writes nothing between them, for gradients
 * aligned for 16-byte moves and not (the one-byte path), of odd byte counts, and more of them than one launch takes. */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"

#ifdef DEFT_HAVE_CUDA

#define N_PACK 70   /* more than DEFT_PACK_MAX: two launches */

static void test_pack(void) {
    size_t place[N_PACK], bytes[N_PACK], offset[N_PACK], total = 0, used = 0;
    for (int i = 0; i < N_PACK; i++) {
        bytes[i] = i == 0 ? 40000 : (size_t)(1 + (i * 37) % 300);
        place[i] = total + (size_t)(i % 3 == 1 ? 4 : 0);   /* every third gradient starts 4 bytes off alignment */
        total = (place[i] + bytes[i] + 255) / 256 * 256;
        used = (used + 15) / 16 * 16;
        offset[i] = used;
        used += bytes[i];
    }
    unsigned char *host = malloc(total), *back = malloc(total), *packed_host = malloc(used);
    void *dev = NULL, *packed = NULL;   /* the gradients, the packed buffer */
    CHECK_OK(deft_cuda_alloc(0, total, &dev));
    CHECK_OK(deft_cuda_alloc(0, used, &packed));
    if (!dev || !packed || !host || !back || !packed_host) goto done;
    for (size_t k = 0; k < total; k++) host[k] = (unsigned char)(k * 131 + 7);
    CHECK_OK(deft_cuda_copy(0, dev, -1, host, total, 0));
    void *tensors[N_PACK];
    for (int i = 0; i < N_PACK; i++) tensors[i] = (char *)dev + place[i];
    /* The packed buffer starts filled with a marker: the alignment gaps between its parts must keep it. */
    memset(packed_host, 0xA5, used);
    CHECK_OK(deft_cuda_copy(0, packed, -1, packed_host, used, 0));
    CHECK_OK(deft_cuda_dist_pack(tensors, offset, bytes, N_PACK, packed, 0, NULL));
    CHECK_OK(deft_cuda_copy(-1, packed_host, 0, packed, used, 1));
    int wrong = 0;
    size_t gap_written = 0;
    for (int i = 0; i < N_PACK; i++) {
        wrong += memcmp(packed_host + offset[i], host + place[i], bytes[i]) != 0;
        for (size_t k = i ? offset[i - 1] + bytes[i - 1] : 0; k < offset[i]; k++) gap_written += packed_host[k] != 0xA5;
    }
    CHECK_MSG(wrong == 0, "pack: %d of %d gradients wrong in the packed buffer", wrong, N_PACK);
    CHECK_MSG(gap_written == 0, "pack: %zu bytes of the gaps between the parts were written", gap_written);
    /* Unpack into cleared gradients: every byte comes back, the gaps between them stay cleared. */
    memset(back, 0, total);
    CHECK_OK(deft_cuda_copy(0, dev, -1, back, total, 0));
    CHECK_OK(deft_cuda_dist_pack(tensors, offset, bytes, N_PACK, packed, 1, NULL));
    CHECK_OK(deft_cuda_copy(-1, back, 0, dev, total, 1));
    wrong = 0;
    size_t stray = 0, at = 0;
    for (int i = 0; i < N_PACK; i++) {
        wrong += memcmp(back + place[i], host + place[i], bytes[i]) != 0;
        for (; at < place[i]; at++) stray += back[at] != 0;
        at = place[i] + bytes[i];
    }
    CHECK_MSG(wrong == 0 && stray == 0, "unpack: %d gradients wrong, %zu stray bytes written", wrong, stray);
done:
    deft_cuda_free(0, dev);
    deft_cuda_free(0, packed);
    free(host);
    free(back);
    free(packed_host);
}

int main(void) {
    SKIP_WITHOUT_GPU();
    test_pack();
    CHECK_OK(deft_cuda_synchronize(0));
    return deft_check_finish();
}

#else

DEFT_CHECK_MAIN_WITHOUT_CUDA

#endif
