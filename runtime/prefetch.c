/* deft_program_feed_async: an input fed from pinned host memory by an asynchronous copy into a second device slot,
 * so that the copy of batch k+1 runs while step k computes.
 *
 * Each input fed this way has two slots: the one the program's steps read (the node's input_storage, as for a
 * synchronous feed) and a spare one. feed_async queues the copy into the spare slot on the GPU's copy stream and
 * records an event after it; the next run makes the spare slot current and its stream wait for that event
 * (cudaStreamWaitEvent: the device waits, the host never does). After a run, an event on the program's stream marks
 * the last read of each current slot; the next copy into that slot (two runs later) waits for it on the copy stream,
 * so a step in flight never sees its input overwritten. A captured CUDA Graph bakes in slot addresses, so
 * runtime/program_graph.c keeps one graph per combination of slots (p->gpu->key), captured the first time it is met.
 *
 * Synchronous feeds stay correct beside this: deft_program_feed writes the current slot through the legacy stream,
 * which the program's blocking stream is ordered with; before it does, a batch fed asynchronously and not yet run
 * is dropped (the later feed wins) and a copy still filling the current slot is waited for. Reuse of the host
 * buffer is protected by the pinned allocator: feed_async records the copy stream on a block from deft_pinned_alloc
 * (deft_pinned_record_stream), so deft_pinned_free keeps the block out of reuse until the copy has passed. */
#include <stdlib.h>

#include "device_internal.h"
#include "prefetch.h"
#include "program_graph.h"
#include "program_state.h"

#define DEFT_PREFETCH_INPUTS 64   /* the bits of p->gpu->key */

typedef struct deft_prefetch_input {
    int node;
    void *spare;                  /* the slot the steps do not read now (input_storage is the other) */
    int slot;                     /* which of the two physical slots input_storage is: 0 the compiled one, 1 ours */
    bool pending;                 /* the spare slot holds a batch fed asynchronously that the next run reads */
    void *copied[2];              /* per physical slot: after its last copy (copy stream) */
    void *read[2];                /* per physical slot: after the last run that read it (the program's stream) */
    bool copied_rec[2], read_rec[2];
} deft_prefetch_input;

struct deft_prefetch {
    int device;
    void *copy_stream;
    int n;
    deft_prefetch_input inputs[DEFT_PREFETCH_INPUTS];
};

static deft_prefetch_input *deft_prefetch_find(deft_prefetch *pf, int node) {
    for (int i = 0; pf && i < pf->n; i++)
        if (pf->inputs[i].node == node) return &pf->inputs[i];
    return NULL;
}

static deft_status deft_prefetch_state(deft_program *p, deft_prefetch **out) {
    if (!p->prefetch) {
        deft_prefetch *pf = calloc(1, sizeof *pf);
        if (!pf) return deft_set_error(DEFT_ERR_OOM, "feed_async: out of host memory");
        pf->device = p->gpu->device;
        deft_status s = deft_prefetch_cuda_copy_stream(pf->device, &pf->copy_stream);
        if (s != DEFT_OK) {
            free(pf);
            return s;
        }
        p->prefetch = pf;
    }
    *out = p->prefetch;
    return DEFT_OK;
}

/* The input's entry, with its spare slot and events made on its first asynchronous feed. */
static deft_status deft_prefetch_input_get(deft_program *p, const deft_tensor *input, deft_prefetch_input **out) {
    deft_prefetch *pf = NULL;
    deft_status s = deft_prefetch_state(p, &pf);
    if (s != DEFT_OK) return s;
    deft_prefetch_input *q = deft_prefetch_find(pf, input->id);
    if (q) {
        *out = q;
        return DEFT_OK;
    }
    if (pf->n == DEFT_PREFETCH_INPUTS)
        return deft_set_error(DEFT_ERR_INVALID,
                              "feed_async: input %s: at most %d inputs of a program can be fed asynchronously; feed "
                              "the others with deft_program_feed",
                              input->name, DEFT_PREFETCH_INPUTS);
    q = &pf->inputs[pf->n];
    *q = (deft_prefetch_input){.node = input->id};
    s = deft_mem_alloc_tagged(input->device, deft_tensor_bytes(input), input->name, &q->spare);
    for (int k = 0; k < 2 && s == DEFT_OK; k++) {
        s = deft_prefetch_cuda_event_new(pf->device, &q->copied[k]);
        if (s == DEFT_OK) s = deft_prefetch_cuda_event_new(pf->device, &q->read[k]);
    }
    if (s != DEFT_OK) {
        for (int k = 0; k < 2; k++) {
            deft_prefetch_cuda_event_free(pf->device, q->copied[k]);
            deft_prefetch_cuda_event_free(pf->device, q->read[k]);
        }
        if (q->spare) deft_mem_free(input->device, q->spare);
        return s;
    }
    pf->n++;
    *out = q;
    return DEFT_OK;
}

deft_status deft_program_feed_async(deft_program *p, deft_tensor *input, const void *host, size_t bytes) {
    deft_status s = deft_feed_check(p, input, host, bytes, "feed_async");
    if (s != DEFT_OK) return s;
    deft_node_state *st = &p->nodes[input->id];
    if (!st->needed) return DEFT_OK;
    /* Eager programs on the CPU or over several devices have no stream to overlap with: a plain copy is as fast. */
    if (p->gpu->device < 0 || input->device.type != DEFT_CUDA || input->device.index != p->gpu->device || bytes == 0)
        return deft_program_feed(p, input, host, bytes);
    int block = deft_pinned_is_page_locked(host);
    if (!block && !deft_prefetch_cuda_host_is_pinned(host))
        return deft_set_error(DEFT_ERR_INVALID,
                              "feed_async: the host buffer for input %s is not pinned memory; allocate it with "
                              "deft_pinned_alloc (or feed it with deft_program_feed, which copies from any memory)",
                              input->name);
    deft_prefetch_input *q = NULL;
    s = deft_prefetch_input_get(p, input, &q);
    if (s != DEFT_OK) return s;
    deft_prefetch *pf = p->prefetch;
    int target = q->slot ^ 1;
    if (q->read_rec[target]) s = deft_prefetch_cuda_stream_wait(pf->device, pf->copy_stream, q->read[target]);
    if (s == DEFT_OK) s = deft_prefetch_cuda_copy_h2d(pf->device, q->spare, host, bytes, pf->copy_stream);
    if (s == DEFT_OK) s = deft_prefetch_cuda_record(pf->device, q->copied[target], pf->copy_stream);
    if (s != DEFT_OK) {
        q->pending = false;
        return s;
    }
    q->copied_rec[target] = true;
    /* Only the start of a block is known to the pool (an interior pointer is refused, and ignored here); memory
     * pinned otherwise, or through an interior pointer, is the caller's to keep until the copy is done. */
    if (block) (void)deft_pinned_record_stream((void *)host, pf->copy_stream);
    q->pending = true;
    st->fed = true;
    return DEFT_OK;
}

deft_status deft_prefetch_before_feed(deft_program *p, const deft_tensor *input) {
    /* Only lane 0's GPU orders the legacy stream's copy of the feed after the run that reads the slot; the copies
     * of a CPU input and the steps of other GPUs are waited for. */
    if (p->gpu->device >= 0 && (input->device.type != DEFT_CUDA || input->device.index != p->gpu->device)) {
        deft_status s = deft_lanes_wait_idle(p);
        if (s != DEFT_OK) return s;
    }
    deft_prefetch_input *q = deft_prefetch_find(p->prefetch, input->id);
    if (!q) return DEFT_OK;
    q->pending = false;
    return q->copied_rec[q->slot] ? deft_prefetch_cuda_event_sync(p->prefetch->device, q->copied[q->slot]) : DEFT_OK;
}

deft_status deft_prefetch_before_run(deft_program *p) {
    deft_prefetch *pf = p->prefetch;
    if (!pf) return DEFT_OK;
    uint64_t key = 0;
    for (int i = 0; i < pf->n; i++) {
        deft_prefetch_input *q = &pf->inputs[i];
        if (q->pending) {
            int target = q->slot ^ 1;
            deft_status s = deft_prefetch_cuda_stream_wait(pf->device, p->gpu->stream, q->copied[target]);
            if (s != DEFT_OK) return s;
            deft_node_state *st = &p->nodes[q->node];
            void *cur = st->input_storage;
            st->input_storage = q->spare;
            q->spare = cur;
            q->slot = target;
            q->pending = false;
        }
        if (q->slot) key |= (uint64_t)1 << i;
    }
    p->gpu->key = key;
    return DEFT_OK;
}

deft_status deft_prefetch_after_run(deft_program *p) {
    deft_prefetch *pf = p->prefetch;
    for (int i = 0; pf && i < pf->n; i++) {
        deft_prefetch_input *q = &pf->inputs[i];
        deft_status s = deft_prefetch_cuda_record(pf->device, q->read[q->slot], p->gpu->stream);
        if (s != DEFT_OK) return s;
        q->read_rec[q->slot] = true;
    }
    return DEFT_OK;
}

void deft_prefetch_free(deft_program *p) {
    deft_prefetch *pf = p->prefetch;
    if (!pf) return;
    for (int i = 0; i < pf->n; i++) {
        deft_prefetch_input *q = &pf->inputs[i];
        for (int k = 0; k < 2; k++) {
            if (q->copied_rec[k]) (void)deft_prefetch_cuda_event_sync(pf->device, q->copied[k]);
            deft_prefetch_cuda_event_free(pf->device, q->copied[k]);
            deft_prefetch_cuda_event_free(pf->device, q->read[k]);
        }
        deft_mem_free(p->graph->nodes[q->node]->device, q->spare);
    }
    free(pf);
    p->prefetch = NULL;
}

deft_status deft_prefetch_fence(deft_program *p, void **event, int *device, int *recorded) {
    *recorded = 0;
    if (!p->prefetch) return DEFT_OK;   /* nothing was ever copied asynchronously by p */
    deft_prefetch *pf = p->prefetch;
    if (*event && *device != pf->device) {
        deft_prefetch_cuda_event_free(*device, *event);
        *event = NULL;
    }
    if (!*event) {
        deft_status s = deft_prefetch_cuda_event_new(pf->device, event);
        if (s != DEFT_OK) return s;
        *device = pf->device;
    }
    deft_status s = deft_prefetch_cuda_record(pf->device, *event, pf->copy_stream);
    if (s == DEFT_OK) *recorded = 1;
    return s;
}
