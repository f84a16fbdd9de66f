/* Without NCCL no deft_dist can be made (dist/dist.c says so first); these answer the same, should anything
 * reach them. */
#include <stdio.h>

#include "dist.h"
#include "graph_internal.h"

int deft_has_nccl_build(void) { return 0; }

static deft_status deft_no_nccl(void) {
    return deft_set_error(DEFT_ERR_NO_CUDA, "dist: deft was built without NCCL (DEFT_NCCL=OFF or no NCCL found)");
}

deft_status deft_nccl_unique_id(void *blob) {
    (void)blob;
    return deft_no_nccl();
}
deft_status deft_nccl_init_local(deft_dist *d) {
    (void)d;
    return deft_no_nccl();
}
deft_status deft_nccl_init_rank(deft_dist *d, const void *id) {
    (void)d;
    (void)id;
    return deft_no_nccl();
}
void deft_nccl_destroy(deft_dist *d) { (void)d; }
void deft_dist_abort(deft_dist *d, const char *why) {
    if (!d->aborted) snprintf(d->failure, sizeof d->failure, "%s", why);
    d->aborted = true;
}
deft_status deft_nccl_all_reduce_avg(deft_dist *d, int local, const deft_dist_buffers *b, void *stream) {
    (void)d, (void)local, (void)b, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_broadcast0(deft_dist *d, int local, const deft_dist_buffers *b, void *stream) {
    (void)d, (void)local, (void)b, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_wait_stream(deft_dist *d, int local, void *stream) {
    (void)d, (void)local, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_stream_new(int device, void **stream) {
    (void)device, (void)stream;
    return deft_no_nccl();
}
void deft_nccl_stream_free(int device, void *stream) { (void)device, (void)stream; }
deft_status deft_nccl_event_new(int device, void **event) {
    (void)device, (void)event;
    return deft_no_nccl();
}
void deft_nccl_event_free(int device, void *event) { (void)device, (void)event; }
deft_status deft_nccl_stream_after(int device, void *waiter, void *stream, void *event) {
    (void)device, (void)waiter, (void)stream, (void)event;
    return deft_no_nccl();
}
deft_status deft_nccl_all_reduce_packed(deft_dist *d, int local, const deft_dist_buffers *b, const size_t *offset,
                                        const size_t *bytes, void *packed, size_t packed_bytes, void *stream) {
    (void)d, (void)local, (void)b, (void)offset, (void)bytes, (void)packed, (void)packed_bytes, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_zero(int device, void *ptr, size_t bytes) {
    (void)device, (void)ptr, (void)bytes;
    return deft_no_nccl();
}
deft_status deft_nccl_reduce_avg(deft_dist *d, int local, const deft_dist_reduces *r, void *stream) {
    (void)d, (void)local, (void)r, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_all_reduce_sum_f64(deft_dist *d, int local, double *x, void *stream) {
    (void)d, (void)local, (void)x, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_all_gather(deft_dist *d, int local, void *buf, size_t shard, deft_dtype dt, void *stream) {
    (void)d, (void)local, (void)buf, (void)shard, (void)dt, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_broadcast_pieces(deft_dist *d, int local, void *buf, const struct deft_zero_f32_piece *pieces,
                                       int n, deft_dtype dt, void *stream) {
    (void)d, (void)local, (void)buf, (void)pieces, (void)n, (void)dt, (void)stream;
    return deft_no_nccl();
}
deft_status deft_nccl_gather_whole(deft_dist *d, int n, const int *locals, void *const *bufs, size_t shard,
                                   deft_dtype dt, void *const *streams) {
    (void)d, (void)n, (void)locals, (void)bufs, (void)shard, (void)dt, (void)streams;
    return deft_no_nccl();
}
