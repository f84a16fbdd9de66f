/* Data-parallel training over NCCL (included by deft.h). */
#ifndef DEFT_PUBLIC_DIST_H
#define DEFT_PUBLIC_DIST_H

#include "deft/core.h"
#include "deft/data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- several GPUs: data-parallel training over NCCL ----
 * A deft_dist holds NCCL communicators: every local GPU of one process (deft_dist_init_local), or one rank of a
 * group of processes on one host or many (deft_dist_init), which find each other through a rendezvous. Each rank
 * builds the same training graph on its own GPU and compiles it with the compile options `dist` and `dist_local`:
 * the program is then a replica whose step all-reduces (averages) the gradients that its optimizers read, in
 * buckets of at most `bucket_bytes`, each queued on a communication stream as soon as the backward pass has
 * produced the last gradient of the bucket (overlapping the rest of the backward pass), and joined back before the
 * optimizer's step reads them: all of it inside the step's CUDA Graph. Replicas start from rank 0's parameters and
 * buffers (broadcast at their first run) and stay bit-identical. NCCL's NVLink multicast (NVLS) is switched off
 * (NCCL_NVLS_ENABLE=0 unless the environment says otherwise). Every wait on another rank has a deadline: a rank
 * that does not come to the rendezvous, or stops or dies later, is a DEFT_ERR_RUNTIME on the others (the
 * communicators are aborted) within `timeout_s`, never a hang. Without NCCL (or without a GPU) the calls fail with
 * DEFT_ERR_NO_CUDA. With the compile option zero_stage = 1 (ZeRO-1) each rank keeps the optimizer state of its 1 / world
 * slice of the parameters only: the gradients are reduced to their slices' owners in buckets during the backward
 * pass, and the step updates the slice and all-gathers the parameters (docs/data_parallel.md, "ZeRO-1"). */
typedef struct deft_dist deft_dist;
#define DEFT_HAS_DIST 1
int deft_has_nccl_build(void);                 /* 1 if built with NCCL */
typedef struct deft_dist_options {
    int rank, world;           /* this process's rank in [0, world) */
    /* How the ranks meet: "file:PATH" (rank 0 writes NCCL's id to PATH, which every rank can read: a shared
     * directory; the others take it and leave PATH.rankN beside it; PATH must not be left from an earlier run) or
     * "tcp:HOST:PORT" (rank 0 listens on PORT, the others connect to HOST:PORT). */
    const char *rendezvous;
    int device;                /* this rank's GPU (cuda:device); -1: rank modulo the visible GPUs */
    double timeout_s;          /* the deadline of every wait on another rank; 0: 300 */
    /* The blocks (NCCL's CTAs, one per channel) each collective runs with, as NCCL_MIN_CTAS = NCCL_MAX_CTAS would
     * set them: more move the gradients faster, fewer leave more of the GPU to the backward pass they overlap.
     * 0: DEFT_DIST_DEFAULT_BLOCKS; else 1 .. DEFT_DIST_MAX_BLOCKS. Every rank should give the same. */
    int collective_blocks;
} deft_dist_options;
#define DEFT_DIST_DEFAULT_BLOCKS 32
#define DEFT_DIST_MAX_BLOCKS 64
/* One communicator per GPU cuda:0 .. cuda:ngpus-1 of this process (ranks 0 .. ngpus-1). Their replicas run their
 * steps together through deft_dist_run (one host thread per GPU). timeout_s: as in deft_dist_options. */
deft_status deft_dist_init_local(int ngpus, double timeout_s, deft_dist **out);
/* The same with every option: ngpus, timeout_s and collective_blocks as above. */
typedef struct deft_dist_local_options {
    int ngpus;
    double timeout_s;
    int collective_blocks;
} deft_dist_local_options;
deft_status deft_dist_init_local_with(const deft_dist_local_options *o, deft_dist **out);
/* One rank of `world`, one process each; returns once every rank has joined (or with an error at the deadline). */
deft_status deft_dist_init(const deft_dist_options *o, deft_dist **out);
/* The options a launcher gives this process through the environment (scripts/deft_launch, torchrun, mpirun):
 * rank and world from RANK and WORLD_SIZE (torchrun's names), else OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE
 * (Open MPI), else PMI_RANK and PMI_SIZE (MPICH and others); device from LOCAL_RANK (or
 * OMPI_COMM_WORLD_LOCAL_RANK), else -1; the rendezvous "tcp:MASTER_ADDR:MASTER_PORT", written into `rendezvous` (n
 * bytes), which o->rendezvous then points to. MPI launchers set no MASTER_ADDR or MASTER_PORT: pass them (mpirun -x).
 * An empty variable counts as unset. o->timeout_s and o->collective_blocks are left as they were. A missing variable
 * or a bad value (not a decimal integer, negative, rank >= world, world < 1, a port outside 1..65535, an address too
 * long for the buffer) is DEFT_ERR_INVALID naming the variable and its value, and leaves *o and the buffer as they
 * were. */
deft_status deft_dist_options_from_env(deft_dist_options *o, char *rendezvous, size_t n);
/* deft_dist_options_from_env, then deft_dist_init with timeout_s (0: 300 s). */
deft_status deft_dist_init_env(double timeout_s, deft_dist **out);
/* Stops the threads of deft_dist_run and destroys the communicators; free the programs compiled with it first. */
void deft_dist_free(deft_dist *d);
int deft_dist_world(const deft_dist *d);
int deft_dist_local_count(const deft_dist *d);                 /* communicators this process holds */
int deft_dist_rank(const deft_dist *d, int local);             /* the global rank of the local-th one, -1 if none */
deft_device deft_dist_device(const deft_dist *d, int local);   /* its GPU */
/* Runs one step of every local replica together (replicas[i] compiled with dist_local = i; anything else is
 * DEFT_ERR_INVALID), one host thread per GPU (started at the first run, kept until deft_dist_free), and returns once
 * each is queued, like deft_program_run. Call it from one thread at a time per dist. A replica of a deft_dist_init_local communicator
 * with several GPUs cannot run alone (its all-reduce would wait for the others): deft_program_run refuses it. */
deft_status deft_dist_run(deft_dist *d, deft_program *const *replicas, int n);
/* Waits for the queued steps of a replica, at most the timeout; past it the communicators are aborted and the
 * answer is DEFT_ERR_RUNTIME naming the rank (deft_program_read waits the same way). */
deft_status deft_program_dist_synchronize(deft_program *p);
/* ZeRO-1 with the compile option param_copies: each step all-gathers the bf16 (f16) copies the replicas read, and
 * of the f32 parameters only those the replica reads in f32 (embedding tables, layer norms); the others are then
 * current on their owner only, and deft_param_get of one, deft_param_set, deft_train_state_save and a program that
 * reads one in f32 are refused with DEFT_ERR_STATE until this collective all-gathers the f32 parameters. Every rank
 * calls it, each process with its local replicas (replicas[i] compiled with dist_local = i, n = its communicators);
 * it waits for their queued steps, gathers, and returns once done. Where nothing is partial it gathers the same
 * values again. Gather before freeing the replicas: without a replica of the dist there is no collective to call
 * (a replica compiled again, not yet run, serves). */
deft_status deft_dist_gather_params(deft_dist *d, deft_program *const *replicas, int n);
/* deft_loader_new_dataset's loader for rank `rank` of `world`: global batch k of an epoch (k = 0, 1, ...; in the
 * order drawn from seed and the epoch with shuffle, the same on every rank) goes to rank k % world, so rank r takes
 * batches r, r + world, ...; every rank gets (n / batch) / world batches per epoch, the rest are dropped. */
deft_status deft_loader_new_dataset_shard(const struct deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle,
                                          uint64_t seed, int rank, int world, int depth, deft_loader **out);

#ifdef __cplusplus
}
#endif
#endif
