/* Data (included by deft.h): asynchronous feeding and loaders, parameter and training-state files, idx datasets,
 * CIFAR-10 and token shards. */
#ifndef DEFT_PUBLIC_DATA_H
#define DEFT_PUBLIC_DATA_H

#include "deft/core.h"
#include "deft/train.h"   /* deft_optimizer, for training state */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- prefetch and loading ----
 * deft_program_feed_async queues the copy of a batch from pinned host memory into a second slot of the input and
 * returns at once (like tensor.to("cuda", non_blocking=True) from pin_memory()). The next deft_program_run reads
 * that slot once the copy is done, its stream waiting on the device, never the host; so feeding batch k+1 right
 * after running step k overlaps the copy with the step. A copy never overwrites a slot that a step still in flight
 * reads, and CUDA Graph replays go on (one graph per slot combination). The host buffer must come from
 * deft_pinned_alloc (or be page-locked by cudaHostAlloc / cudaHostRegister); other memory is DEFT_ERR_INVALID. It
 * must not be written until the copy is done: deft_pinned_free it (the pool hands it out again only after the
 * copy, as with Tensor.record_stream), or let a deft_loader recycle it. Feeding the same buffer again at once is
 * safe (copies run in order); a later deft_program_feed of the input replaces a batch fed asynchronously and not
 * yet run. Programs that do not run on one GPU's stream (CPU steps, several devices, dropout) copy synchronously,
 * as deft_program_feed does, from any host memory. */
deft_status deft_program_feed_async(deft_program *p, deft_tensor *input, const void *pinned_host, size_t bytes);

/* A loader (torch.utils.data.DataLoader with pin_memory): a thread of its own fills `depth` pinned batches ahead of
 * the training loop by calling `fill` for batch (epoch, index), index in [0, batches_per_epoch), in order, batch
 * after batch, epoch after epoch; deft_loader_next feeds the next one asynchronously into a program and recycles
 * its buffers once their copies are done. Batches come in the same order whatever the threads' timing.
 * `fill` runs on the loader's thread and writes buffers[i] (deft_tensor_nbytes of inputs[i]) for each input; a
 * status other than DEFT_OK stops the loader, and deft_loader_next returns it with the message the callback left
 * (deft_loader_error sets one) once the batches filled before it are taken. */
typedef struct deft_loader deft_loader;
typedef deft_status (*deft_loader_fill)(void *ctx, int64_t epoch, int64_t index, void *const *buffers);
/* depth 0 means 3; otherwise 2..64. The inputs must stay alive while the loader does. */
deft_status deft_loader_new(deft_tensor *const *inputs, int n_inputs, int64_t batches_per_epoch, int depth,
                            deft_loader_fill fill, void *ctx, deft_loader **out);
/* The built-in loader over a dataset: x ([batch, features], f32) and y ([batch], i32) get consecutive batches of
 * d (which must outlive the loader), the last incomplete one dropped; with shuffle, each epoch in a new order drawn
 * from seed and the epoch number (deft_shuffle). */
struct deft_dataset;   /* below, with the idx files */
deft_status deft_loader_new_dataset(const struct deft_dataset *d, deft_tensor *x, deft_tensor *y, int shuffle,
                                    uint64_t seed, int depth, deft_loader **out);
typedef struct deft_loader_batch {
    int64_t epoch, index;    /* the batch just fed (index -1 when end is set) */
    int64_t fed;             /* batches fed by this loader so far, this one included */
    int end;                 /* 1: the epoch is over and nothing was fed; the next call starts the next epoch */
} deft_loader_batch;
/* Feeds the next batch into p (deft_program_feed_async of each input) and says which it was; after the last batch
 * of an epoch, one call returns with end set. out may be NULL. */
deft_status deft_loader_next(deft_loader *l, deft_program *p, deft_loader_batch *out);
/* The loader's position, for training state: the batch (epoch, index) the next deft_loader_next feeds; index is
 * batches_per_epoch when the last batch of `epoch` was fed and its end not yet reported. deft_loader_seek moves a
 * loader (a new one, or one in use) there: it waits for the batch being filled and for the copies in flight, drops
 * the batches filled ahead and fills from the new position, so that the batches that follow are those an
 * uninterrupted loader would have fed. A position outside [0, batches_per_epoch] is DEFT_ERR_INVALID. */
void deft_loader_position(const deft_loader *l, int64_t *epoch, int64_t *index);
deft_status deft_loader_seek(deft_loader *l, int64_t epoch, int64_t index);
/* Stops the thread (waiting for a fill in progress) and frees the buffers once their copies are done. */
void deft_loader_free(deft_loader *l);
/* For fill callbacks: sets the calling thread's message (printf format) and returns s. */
deft_status deft_loader_error(deft_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- parameter files ----
 * Format (little-endian): "DEFTPARM", u32 version (2), u32 count, u32 CRC-32 of those 16 bytes; then per parameter
 * its header: u32 name length, the name, u32 dtype, u32 ndim, ndim x i64 dims, u64 data bytes; u32 CRC-32 of that
 * header; the data; u32 CRC-32 of the data. Loading checks every checksum and every record against the graph's
 * parameter of that name (dtype, shape) before changing anything: a corrupt or truncated file is DEFT_ERR_IO, an
 * intact file of another model DEFT_ERR_INVALID. Version 1 files (the same without the two header CRCs) still
 * load, their data checked by its CRC. */
deft_status deft_params_save(const deft_graph *g, const char *path);
deft_status deft_params_load(deft_graph *g, const char *path);

/* ---- training state (llm.c's state files: resuming continues bit for bit) ----
 * deft_train_state_save writes, in one checksummed file, what the runs after it depend on: every parameter of p's
 * graph (as a parameter file holds them, read from the device where they live), opt's state (AdamW's moments or
 * SGD's momentum buffer, its update count and current learning rate, f16 loss scaling's scale, growth counter and
 * skipped count, and, saved inside a gradient accumulation window, the gradients summed so far and the runs into
 * the window), p's run counter (from which dropout masks are drawn) and the loader's position
 * (deft_loader_position). deft_train_state_load restores all of it into a graph, optimizer and program built and
 * compiled the same way (the same parameters, optimizer kind and hyperparameters, parameter groups,
 * accumulate_steps and autocast policy), and seeks the loader: the runs that follow give the losses, parameters and
 * batches that the saved program's would have, bit for bit, on the same device. Neither touches how the program
 * runs (a loaded program captures and replays its CUDA Graphs as before); on a GPU both wait for the queued runs.
 * opt may be NULL for a program without an optimizer, loader may be NULL (a load then ignores a saved position);
 * opt must be of p's graph and in use (a program running its step was compiled, else DEFT_ERR_STATE).
 * Saving writes a temporary file beside path and renames it into place, so path holds either its old content or the
 * whole new file. Loading checks the whole file before it changes anything: a truncated or corrupt file is
 * DEFT_ERR_IO naming the file and what is wrong; an intact file of another model or configuration (a parameter's
 * name, dtype or shape, the optimizer's kind, parameters, groups or arrays, accumulate_steps, loss scaling, the
 * loader's batches per epoch, an optimizer or loader state missing) DEFT_ERR_INVALID naming the first difference.
 * An optimizer sharded by ZeRO-1 (the compile option zero_stage) saves this rank's slice of its state, with the world,
 * the rank and the slice in the header: save one file per rank (the name is the caller's, e.g. "state.rank3") and
 * load each into the replica of the same rank in a world of the same size (another rank or world, or a sharded file
 * into an unsharded optimizer or back, is DEFT_ERR_INVALID). */
deft_status deft_train_state_save(const char *path, deft_program *p, deft_optimizer *opt, deft_loader *loader);
deft_status deft_train_state_load(const char *path, deft_program *p, deft_optimizer *opt, deft_loader *loader);
/* What a training-state file says about where training stood (its header, checked, is all that is read). */
typedef struct deft_train_state_summary {
    uint64_t runs;             /* the program's runs (a step each) */
    int has_optimizer;
    int64_t updates;           /* the optimizer's updates applied (skipped f16 steps not counted) */
    double lr;
    int has_loader;
    int64_t epoch, index;      /* the batch the loader feeds next */
} deft_train_state_summary;
deft_status deft_train_state_info(const char *path, deft_train_state_summary *out);

/* ---- datasets in the idx format (MNIST's files) ---- */
typedef struct deft_idx {
    int type;                /* the idx type code: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
    int ndim;
    int64_t dims[DEFT_MAX_DIMS];
    void *data;              /* dims' product elements, host byte order */
    size_t bytes;
} deft_idx;
/* Reads a whole idx file; a bad magic, a short file or sizes that do not match the header are DEFT_ERR_IO with the
 * path and what was wrong. */
deft_status deft_idx_read(const char *path, deft_idx *out);
deft_status deft_idx_write(const char *path, const deft_idx *in);
void deft_idx_free(deft_idx *d);
/* A classification dataset: images as f32 in [0, 1] ([n, features]) and labels as i32. */
typedef struct deft_dataset {
    int64_t n, features;
    int n_classes;           /* 1 + the largest label */
    float *images;
    int32_t *labels;
} deft_dataset;
/* Loads an images idx file (u8, [n, rows, cols] or [n, features]) and a labels idx file (u8, [n]); the counts must
 * agree. */
deft_status deft_dataset_load_idx(const char *images_path, const char *labels_path, deft_dataset *out);
void deft_dataset_free(deft_dataset *d);
/* Copies `batch` samples starting at position `start` of `order` (a permutation of [0, n), or NULL for 0, 1, ...)
 * into x ([batch, features]) and y ([batch]). */
deft_status deft_dataset_batch(const deft_dataset *d, const int64_t *order, int64_t start, int64_t batch, float *x,
                               int32_t *y);
/* Fills order with a permutation of [0, n) drawn from seed (Fisher-Yates). NULL order (n > 0) or n < 0: an error. */
deft_status deft_shuffle(int64_t *order, int64_t n, uint64_t seed);

/* ---- CIFAR-10 (the binary version: data_batch_1..5.bin, test_batch.bin) ----
 * A record is one label byte (0..9) and 3072 pixel bytes: the red, green and blue 32x32 planes, row-major. */
#define DEFT_CIFAR_IMAGE_BYTES 3072
#define DEFT_CIFAR_CLASSES 10
typedef struct deft_cifar {
    int64_t n;
    uint8_t *pixels;         /* [n, 3, 32, 32] bytes, as in the files */
    int32_t *labels;         /* [n], 0..9 */
} deft_cifar;
/* Reads the records of the files in order. A file that is empty or not a whole number of records (truncated), a
 * label above 9 or a file that cannot be read is DEFT_ERR_IO with the path and what was wrong; nothing is kept. */
deft_status deft_cifar_read(const char *const *paths, int n_paths, deft_cifar *out);
/* train: dir/data_batch_1.bin .. dir/data_batch_5.bin; else dir/test_batch.bin. */
deft_status deft_cifar_load(const char *dir, int train, deft_cifar *out);
void deft_cifar_free(deft_cifar *d);
/* How batches are made. Pixels become (p / 255 - mean[c]) / std[c] with CIFAR-10's mean (0.4914, 0.4822, 0.4465)
 * and std (0.2470, 0.2435, 0.2616), in f32 [batch, 3, 32, 32] (DEFT_NCHW) or [batch, 32, 32, 3] (DEFT_NHWC).
 * Augmentation as torchvision's RandomCrop(32, padding=crop_padding) (zero pixels around) then
 * RandomHorizontalFlip(), drawn from seed, the epoch and the sample's index in the dataset: deterministic. Zeros
 * mean: NCHW, no augmentation, no shuffling. */
typedef struct deft_cifar_options {
    deft_layout layout;
    int crop_padding;        /* 0: no crop; 4 is the usual; at most 16 */
    int flip;                /* 1: mirror left-right with probability 1/2 */
    int shuffle;             /* 1 (feeds only): each epoch in a new order from seed and the epoch (deft_shuffle) */
    uint64_t seed;
} deft_cifar_options;
/* The crop offset and flip that sample `sample` gets in `epoch`: output pixel (y, x) is input pixel
 * (y + dy, (flip ? 31 - x : x) + dx), zero outside the image. */
typedef struct deft_cifar_augmentation {
    int dy, dx, flip;
} deft_cifar_augmentation;
deft_cifar_augmentation deft_cifar_augment_draw(const deft_cifar_options *o, int64_t epoch, int64_t sample);
/* As deft_dataset_batch: `batch` samples from position `start` of order (NULL: 0, 1, ...) into x and y, augmented
 * for `epoch` as opts says (NULL: NCHW, plain). */
deft_status deft_cifar_batch(const deft_cifar *d, const int64_t *order, int64_t start, int64_t batch,
                             const deft_cifar_options *opts, int64_t epoch, float *x, int32_t *y);
/* A feed makes batch (epoch, index) of d (which must outlive it) for a deft_loader: deft_cifar_feed_fill is a
 * deft_loader_fill over it, so decoding, normalising and augmenting run on the loader's thread. The last incomplete
 * batch of an epoch is dropped. */
typedef struct deft_cifar_feed deft_cifar_feed;
deft_status deft_cifar_feed_new(const deft_cifar *d, int64_t batch, const deft_cifar_options *opts,
                                deft_cifar_feed **out);
int64_t deft_cifar_feed_batches(const deft_cifar_feed *f);                       /* per epoch */
deft_status deft_cifar_feed_fill(void *feed, int64_t epoch, int64_t index, void *const *buffers);
void deft_cifar_feed_free(deft_cifar_feed *f);   /* after the loader that uses it */
/* A loader over the feed into x (f32, the feed's layout and batch) and y (i32 [batch]); other shapes are refused. */
deft_status deft_loader_new_cifar(deft_cifar_feed *f, deft_tensor *x, deft_tensor *y, int depth, deft_loader **out);

/* ---- token shards (llm.c's format, as its dev/data scripts write them) ----
 * A shard is a header of 256 little-endian int32 (magic 20240520, version 1, the token count, the rest 0) and then
 * that many little-endian uint16 tokens. The shards of a set are one stream of tokens, in the order of their paths;
 * scripts/text_to_tokens.py makes them from a text file (bytes, characters, or GPT-2's BPE through tiktoken). */
#define DEFT_TOKENS_MAGIC 20240520
#define DEFT_TOKENS_VERSION 1
#define DEFT_TOKENS_HEADER_BYTES 1024
typedef struct deft_tokens deft_tokens;
/* pattern: one file, a directory (its *.bin files) or a glob(3) pattern ("data/fineweb_train_*.bin"); the files
 * are taken in byte order of their paths. Every file is checked before any is used, and nothing is kept when one
 * fails: no file matching, a file that cannot be opened, a magic or version other than llm.c's GPT-2 shards', a
 * short header, or a count that disagrees with the file's size (truncated, or too long) is DEFT_ERR_IO naming the
 * file and what is wrong. The files are mapped into memory, not read, so opening costs nothing per token; they must
 * not shrink while open. */
deft_status deft_tokens_open(const char *pattern, deft_tokens **out);
int64_t deft_tokens_count(const deft_tokens *t);                    /* over all its shards; 0 for NULL */
int deft_tokens_shards(const deft_tokens *t);
const char *deft_tokens_shard_path(const deft_tokens *t, int shard);   /* NULL outside [0, shards) */
/* Tokens [start, start + n) of the stream, across shard boundaries, as i32; outside [0, count) is
 * DEFT_ERR_INVALID. Any number of threads may read at once. */
deft_status deft_tokens_read(const deft_tokens *t, int64_t start, int64_t n, int32_t *out);
void deft_tokens_close(deft_tokens *t);
/* Writes a shard of n tokens (n in [0, 2^31)), each in [0, 65535], else DEFT_ERR_INVALID with nothing written. */
deft_status deft_tokens_write(const char *path, const int32_t *tokens, int64_t n);

/* Next-token batches over a token stream: it is cut into W = (count - 1) / seq windows, window w starting at token
 * w * seq; a row of x is a window's first seq tokens and the same row of y the seq tokens one further (x's
 * targets). An epoch orders the W windows (in stream order, or a permutation drawn from seed and the epoch by
 * deft_shuffle), and rank r of world takes windows r, r + world, r + 2 world, ... of that order, so ranks never
 * share a window; each takes (W / world) / batch batches an epoch, the windows left over are dropped. Batch i of a
 * rank is its windows [i * batch, (i + 1) * batch). Zero options: stream order, one rank (for validation). */
typedef struct deft_tokens_options {
    int shuffle;             /* 1: a new order each epoch */
    uint64_t seed;
    int rank, world;         /* world 0 means 1 */
} deft_tokens_options;
typedef struct deft_tokens_feed deft_tokens_feed;
/* t must outlive the feed. Fewer windows than one batch per rank is DEFT_ERR_INVALID. */
deft_status deft_tokens_feed_new(const deft_tokens *t, int64_t batch, int64_t seq, const deft_tokens_options *opts,
                                 deft_tokens_feed **out);
int64_t deft_tokens_feed_batches(const deft_tokens_feed *f);   /* per epoch, for this rank */
/* A deft_loader_fill: batch (epoch, index) into buffers[0] (x) and buffers[1] (y), i32 [batch, seq] each. One
 * thread at a time (it keeps the epoch's order). */
deft_status deft_tokens_feed_fill(void *feed, int64_t epoch, int64_t index, void *const *buffers);
void deft_tokens_feed_free(deft_tokens_feed *f);   /* after the loader that uses it */
/* A loader over the feed into x and y, inputs of i32 [batch, seq]: batches are made on the loader's thread into
 * pinned buffers and fed asynchronously; deft_loader_position / deft_loader_seek save and restore where it is. */
deft_status deft_loader_new_tokens(deft_tokens_feed *f, deft_tensor *x, deft_tensor *y, int depth, deft_loader **out);

#ifdef __cplusplus
}
#endif
#endif
