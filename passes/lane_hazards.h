/* Which lanes a step must wait for: the bookkeeping of runtime/program_lanes.c, apart from any stream, so that the
 * rules can be tested on the CPU (tests/test_lane_hazards.c).
 *
 * Lanes 0..n-1 are GPU streams; the host is lane n. Memory belongs to a lane too: a GPU's memory to that GPU's lane,
 * host memory to the host. A step touches ranges of memory, each read or written. Every GPU step works in its own
 * GPU's memory, so the accesses a lane makes to memory that is not its own are the copies (a GPU reading another
 * GPU's memory, a GPU reading or writing host memory): they are few, and they are kept one by one, with their byte
 * ranges. The owner's own accesses are kept as one count per lane.
 *  - A lane touching memory it does not own waits for the owner's last step on it (coarse: a copy waits for the
 *    producer of what it copies, which is mostly the owner's last step anyway).
 *  - Any lane waits for the other lanes' recorded accesses (not its own) whose ranges overlap its own, where either
 *    access writes: a GPU overwriting a buffer that another GPU's copy still reads, the host writing host memory that
 *    a copy to a GPU still reads, a copy from a GPU writing host memory that another copy reads.
 *  - A lane that waited for lane k has seen all that k queued before; it does not wait for it again until k queues
 *    more. The host's steps are done when they return: they leave nothing to wait for. */
#ifndef DEFT_LANE_HAZARDS_H
#define DEFT_LANE_HAZARDS_H

#include <stdbool.h>
#include <stdint.h>

#include "graph_internal.h"

#define DEFT_MAX_LANES 16   /* GPUs one program may touch (as many as it has arenas) */

typedef struct deft_range {
    int mem;                 /* the lane owning the memory: a GPU's lane, or n for the host */
    uintptr_t lo, hi;        /* bytes [lo, hi) */
    bool write;
} deft_range;

typedef struct deft_foreign_access {
    int lane;
    deft_range range;
    int64_t at;              /* the lane's step count after it */
} deft_foreign_access;

typedef struct deft_hazards {
    int n;                                               /* GPU lanes */
    int64_t issued[DEFT_MAX_LANES];                      /* steps queued on each GPU lane this run */
    int64_t seen[DEFT_MAX_LANES + 1][DEFT_MAX_LANES];    /* [lane l or host][k]: issued[k] when l last waited on k */
    int64_t own_at[DEFT_MAX_LANES];                      /* each GPU lane's last step on its own memory */
    int n_foreign, cap_foreign;
    deft_foreign_access *foreign;                        /* this run's accesses of lanes to memory not their own */
} deft_hazards;

/* Starts a run (keeps the storage of the foreign accesses). */
void deft_hazards_reset(deft_hazards *h, int n_lanes);
void deft_hazards_free(deft_hazards *h);
/* The lanes (bit k: lane k) that `lane` must wait for before a step touching ranges r[0..nr). */
uint32_t deft_hazards_waits(const deft_hazards *h, int lane, const deft_range *r, int nr);
/* As deft_hazards_waits, and upto[k] (for each bit k set; h->n entries) says through which of lane k's steps (its
 * count, 1 for the first) the wait must reach: a lane whose steps each record an event can wait for just that one. */
uint32_t deft_hazards_waits_upto(const deft_hazards *h, int lane, const deft_range *r, int nr, int64_t *upto);
/* `lane` waited for everything lane k queued so far. */
void deft_hazards_waited(deft_hazards *h, int lane, int k);
/* `lane` waited for lane k's steps through count `at`. */
void deft_hazards_waited_upto(deft_hazards *h, int lane, int k, int64_t at);
/* A step touching r[0..nr) was queued on GPU lane `lane` (nothing to note for the host's). DEFT_ERR_OOM when the
 * record of foreign accesses cannot grow. */
deft_status deft_hazards_queued(deft_hazards *h, int lane, const deft_range *r, int nr);

#endif
