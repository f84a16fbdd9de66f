/* Data parallel training, private to dist/: communicators (dist/dist.c), the rendezvous that hands NCCL's id
 * to every rank (dist/dist_rendezvous.c), the NCCL calls (dist/dist_nccl.c, or dist_nonccl.c without NCCL)
 * and the replica's gradient buckets placed in its step (dist/dist_program.c). */
#ifndef DEFT_DIST_H
#define DEFT_DIST_H

#include <stdbool.h>

#include "deft.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DEFT_DIST_MAX_LOCAL 16          /* communicators one process may hold (GPUs of one host) */
#define DEFT_DIST_MAX_WORLD 1024          /* ranks in all */
#define DEFT_DIST_ID_BYTES 128          /* NCCL_UNIQUE_ID_BYTES */
#define DEFT_DIST_DEFAULT_TIMEOUT 300.0
/* The blocks (NCCL channels) a collective runs with are the options' collective_blocks, by default 32
 * (DEFT_DIST_DEFAULT_BLOCKS): more than NCCL chose by itself on one host, which shortened the mid MLP's 4-GPU step and
 * left ResNet-18 bf16's unchanged (bench/RESULTS.md, "Tenth round"). */

struct deft_program;

struct deft_dist {
    int world;
    int n_local;
    int rank[DEFT_DIST_MAX_LOCAL];      /* global rank of each local communicator */
    int device[DEFT_DIST_MAX_LOCAL];
    void *comm[DEFT_DIST_MAX_LOCAL];    /* ncclComm_t */
    bool nonblocking;                   /* created with config.blocking = 0: calls may answer ncclInProgress */
    double timeout_s;
    int blocks;                         /* NCCL blocks per collective (deft_dist_options.collective_blocks, resolved) */
    int running;                        /* deft_dist_run is running the replicas together */
    bool aborted;                       /* a deadline passed or NCCL failed: the communicators were aborted */
    char failure[512];
    struct deft_dist_workers *workers;  /* the threads that queue the local replicas' steps (dist/dist_run.c) */
    struct deft_dist_gate *gate;        /* what they pass around each collective (dist/dist_gate.c) */
};

/* The gate of deft_dist_run's replicas (dist/dist_gate.c): made with the workers, begun for each run with the number
 * of replicas, left by each replica whose run ended. deft_dist_gate_pass (before and after queuing a collective,
 * outside a replay) returns once every replica still in the run has arrived, DEFT_ERR_RUNTIME past d's deadline; it
 * does nothing outside deft_dist_run or with one local replica. */
typedef struct deft_dist_gate deft_dist_gate;
deft_status deft_dist_gate_new(deft_dist_gate **out);
void deft_dist_gate_free(deft_dist_gate *g);
void deft_dist_gate_begin(deft_dist_gate *g, int parties);
void deft_dist_gate_leave(deft_dist_gate *g);
deft_status deft_dist_gate_pass(deft_dist *d, int local, const char *what);

/* Stops and joins the threads of deft_dist_run, if it started them (deft_dist_free). */
void deft_dist_workers_stop(deft_dist *d);

/* Rank 0 publishes `bytes` of `blob`; every other rank waits for them and copies them into blob. Rank 0 returns
 * once every rank has taken them, and every rank fails with DEFT_ERR_RUNTIME (naming who is missing) past
 * timeout_s. spec: "file:PATH" or "tcp:HOST:PORT"; a bad one is DEFT_ERR_INVALID. */
deft_status deft_rendezvous(const char *spec, int rank, int world, void *blob, size_t bytes, double timeout_s);
/* Seconds on a monotonic clock. */
double deft_dist_now(void);

/* ---- the NCCL calls ---- */
deft_status deft_nccl_unique_id(void *blob);                    /* DEFT_DIST_ID_BYTES */
deft_status deft_nccl_init_local(deft_dist *d);                 /* d->n_local, d->device set */
deft_status deft_nccl_init_rank(deft_dist *d, const void *id);  /* d->rank[0], d->device[0], world set */
void deft_nccl_destroy(deft_dist *d);
/* Aborts every communicator of d (once), keeping `why` as the failure every later call reports. */
void deft_dist_abort(deft_dist *d, const char *why);

/* One collective, in place over n tensors (addresses, element counts, dtypes), on the stream of local
 * communicator `local`, as one NCCL group. */
typedef struct deft_dist_buffers {
    int n;
    void **data;
    size_t *count;
    deft_dtype *dtype;
} deft_dist_buffers;
deft_status deft_nccl_all_reduce_avg(deft_dist *d, int local, const deft_dist_buffers *b, void *stream);
deft_status deft_nccl_broadcast0(deft_dist *d, int local, const deft_dist_buffers *b, void *stream);
/* The same average over b packed into `packed` (each gradient's bytes[i] at offset[i], 16-byte aligned, the gaps
 * zero; one dtype): one NCCL all-reduce over `packed_bytes` between a pack and an unpack kernel. */
deft_status deft_nccl_all_reduce_packed(deft_dist *d, int local, const deft_dist_buffers *b, const size_t *offset,
                                        const size_t *bytes, void *packed, size_t packed_bytes, void *stream);
/* ZeRO-1's reduces of one bucket (dist/dist_zero.c builds them): piece k, count[k] elements of dtype[k] at send[k],
 * averaged over the ranks into recv[k] on rank root[k] (recv[k] is used on the root only); one ncclReduce (ncclAvg)
 * per piece, all in one NCCL group. */
typedef struct deft_dist_reduces {
    int n;
    void **send, **recv;
    size_t *count;
    deft_dtype *dtype;
    int *root;
} deft_dist_reduces;
deft_status deft_nccl_reduce_avg(deft_dist *d, int local, const deft_dist_reduces *r, void *stream);
/* ZeRO-1's step's collectives, in place on `stream`: the sum of one f64 (ncclAllReduce); buf's whole gathered from
 * every rank's slice at buf + r * shard (ncclAllGather). */
deft_status deft_nccl_all_reduce_sum_f64(deft_dist *d, int local, double *x, void *stream);
deft_status deft_nccl_all_gather(deft_dist *d, int local, void *buf, size_t shard, deft_dtype dt, void *stream);
/* Each piece [lo, hi) of buf (dt) broadcast in place from its root, as one NCCL group (ZeRO-1's f32 parameters
 * beside the gathered copies). */
struct deft_zero_f32_piece;
deft_status deft_nccl_broadcast_pieces(deft_dist *d, int local, void *buf, const struct deft_zero_f32_piece *pieces,
                                       int n, deft_dtype dt, void *stream);
/* deft_dist_gather_params' all-gathers: for each i of n, bufs[i] (dt, shard elements a rank) gathered in place over
 * local communicator locals[i] on streams[i]: one NCCL group over the local communicators, then every stream waited
 * for (with the deadline). */
deft_status deft_nccl_gather_whole(deft_dist *d, int n, const int *locals, void *const *bufs, size_t shard,
                                   deft_dtype dt, void *const *streams);
/* Zeroes `bytes` at ptr on GPU `device` (a packed bucket's gaps). */
deft_status deft_nccl_zero(int device, void *ptr, size_t bytes);
/* Waits for `stream` of GPU `device`, watching communicator `local` for errors, until the deadline: then aborts. */
deft_status deft_nccl_wait_stream(deft_dist *d, int local, void *stream);

/* The second stream a replica's buckets run on, and one event per bucket (fork in, join out). */
deft_status deft_nccl_stream_new(int device, void **stream);
void deft_nccl_stream_free(int device, void *stream);
deft_status deft_nccl_event_new(int device, void **event);
void deft_nccl_event_free(int device, void *event);
/* `waiter` waits for what is queued on `stream` now, through `event`. */
deft_status deft_nccl_stream_after(int device, void *waiter, void *stream, void *event);

/* ---- the replica's step (dist/dist_program.c), called by runtime/execute.c and runtime/program.c ---- */
/* Checks the data-parallel options (o: p's compile options resolved, passes/compile_config.h) and places the buckets
 * in p's step (compile). */
struct deft_config;
/* Registers the functions below as the runtime's replica hooks (runtime/replica_hooks.h); each dist made does. */
void deft_ddp_register(void);
deft_status deft_ddp_attach(struct deft_program *p, const struct deft_config *o);
/* ZeRO-1 (dist/dist_zero.c): shards every optimizer of g whose step exists across the ranks of o's dist, before their
 * storage is made (one made before must be sharded the same way); DEFT_ERR_INVALID for one that cannot be. */
deft_status deft_zero_shard(deft_graph *g, const struct deft_config *o);
/* ZeRO-1: the reduces of n gradients of sharded optimizer `opt` (a bucket's): gradient k is the one of parameter
 * param[k], data[k] holding it in dtype[k]; each piece that a rank owns goes to that rank, in bucket order and rank
 * order (every rank builds the same list). This rank's pieces land in opt's flat gradients; a gradient not in opt's
 * dtype is DEFT_ERR_DTYPE. */
struct deft_optimizer;
deft_status deft_zero_reduces_new(struct deft_optimizer *opt, int n, const int *param, void *const *data,
                                  const deft_dtype *dtype, deft_dist_reduces *out);
void deft_zero_reduces_free(deft_dist_reduces *r);
void deft_ddp_free(struct deft_program *p);
/* Before deft_program_run: whether p may run now (not alone when its communicator has local peers). */
deft_status deft_ddp_check_run(const struct deft_program *p);
/* Inside a run: the first run broadcasts rank 0's parameters; before step i the buckets read there are joined;
 * after step i the buckets complete there are all-reduced; at the end every bucket is joined. */
deft_status deft_ddp_begin_run(struct deft_program *p);
deft_status deft_ddp_before_step(struct deft_program *p, int step);
deft_status deft_ddp_after_step(struct deft_program *p, int step);
deft_status deft_ddp_end_run(struct deft_program *p);
/* The local communicator of d that p is a replica for (its dist_local), -1 when p is not a replica of d. */
int deft_ddp_local_of(const struct deft_program *p, const deft_dist *d);
/* Waits (with the deadline) for p's queued work. */
deft_status deft_ddp_wait(struct deft_program *p);
/* For tests: the replica's buckets in the order they were cut (the last completes last): their bytes and the step
 * (index in p's steps) each joins back before, into bytes[0 .. max) and joins[0 .. max) (either may be NULL). Returns
 * the number of buckets, -1 when p is not a replica. */
int deft_ddp_bucket_layout(const struct deft_program *p, size_t *bytes, int *joins, int max);
/* For tests: how many of p's buckets are packed into one buffer for their all-reduce; -1 when p is not a replica. */
int deft_ddp_packed_buckets(const struct deft_program *p);
/* For tests: p's buckets of sharded optimizers' gradients (ZeRO-1), in the order they were cut: their bytes, the step
 * after which their reduces are queued (-1: before the first), the step they join back before, and how many
 * ncclReduce calls (pieces) each queues (0 in a world of one, which reduces nothing), into the arrays' first max
 * entries (any may be NULL). Returns the number of such buckets, -1 when p is not a replica. */
int deft_ddp_zero_buckets(const struct deft_program *p, size_t *bytes, int *ready, int *joins, int *pieces, int max);

#ifdef __cplusplus
}
#endif
#endif
