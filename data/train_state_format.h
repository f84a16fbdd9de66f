/* The training-state file's layout, shared by saving (data/train_state.c) and loading (data/train_state_load.c).
 *
 * All little-endian:
 *   head      "DEFTSTAT", u32 version, then the fields of deft_ts_head at the offsets below, u32 CRC-32 of all of it
 *   params    u32 count (the head's n_params) records as parameter files hold them (data/param_records.h)
 *   optimizer (when the head says so) per parameter it updates: its name (64 bytes, NUL-padded), i64 offset and
 *             i64 count in the flat storage, f64 weight decay and f64 lr_scale (its group's); u32 CRC-32 of the list;
 *             then each flat array the head's `arrays` names, in deft_optimizer_array order: u32 array, u32 dtype, u64
 *             bytes, u32 CRC-32 of those 16 bytes, the elements, u32 CRC-32 of them
 * and nothing after.
 *
 * Version 2 is written for a sharded optimizer (ZeRO-1, ir/optimizer.h's deft_optimizer_zero) only: its head has 32
 * bytes more (u32 world, u32 rank, i64 lo, i64 hi, i64 padded: the slice this rank keeps), and its state arrays hold
 * that slice (hi - lo elements) rather than total; the parameters are whole, as every rank holds them. Any other save
 * writes version 1, byte for byte as before; both are read. */
#ifndef DEFT_TRAIN_STATE_FORMAT_H
#define DEFT_TRAIN_STATE_FORMAT_H

#include <string.h>

#include "file_format.h"
#include "half.h"
#include "optimizer_state.h"

#define DEFT_TS_MAGIC "DEFTSTAT"
#define DEFT_TS_MAGIC_LEN 8
#define DEFT_TS_VERSION 1u
#define DEFT_TS_VERSION_ZERO 2u
#define DEFT_TS_HEAD_BYTES 136   /* without its CRC */
#define DEFT_TS_HEAD_BYTES_ZERO 168
#define DEFT_TS_NAME_BYTES 64    /* a node name's room (deft_tensor's name), NUL included */
#define DEFT_TS_ENTRY_BYTES (DEFT_TS_NAME_BYTES + 32)
#define DEFT_TS_ARRAY_HEAD 16

#define DEFT_TS_HAS_OPTIMIZER 1u
#define DEFT_TS_HAS_LOADER 2u

typedef struct deft_ts_head {
    uint32_t flags, n_params;
    uint64_t runs;                         /* the program's run counter */
    int64_t epoch, index, per_epoch;       /* the loader's position and its batches per epoch */
    uint32_t kind, dtype, opt_params, accumulate;
    int64_t total;
    deft_optimizer_counters c;
    uint32_t arrays;                       /* bit a: flat array a (deft_optimizer_array) follows */
    uint32_t world, rank;                  /* ZeRO-1's sharding (version 2; world 0: none) */
    int64_t lo, hi, padded;
} deft_ts_head;

/* The head's bytes without its CRC: version 2's under ZeRO-1. */
static inline size_t deft_ts_head_bytes(const deft_ts_head *h) {
    return h->world ? DEFT_TS_HEAD_BYTES_ZERO : DEFT_TS_HEAD_BYTES;
}

/* The head's bytes (deft_ts_head_bytes, the CRC not included), magic and version first. */
static inline void deft_ts_head_encode(const deft_ts_head *h, unsigned char *b) {
    memset(b, 0, deft_ts_head_bytes(h));
    memcpy(b, DEFT_TS_MAGIC, DEFT_TS_MAGIC_LEN);
    deft_put_le(b + 8, h->world ? DEFT_TS_VERSION_ZERO : DEFT_TS_VERSION, 4);
    deft_put_le(b + 12, h->flags, 4);
    deft_put_le(b + 16, h->n_params, 4);
    deft_put_le(b + 24, h->runs, 8);
    deft_put_le(b + 32, (uint64_t)h->epoch, 8);
    deft_put_le(b + 40, (uint64_t)h->index, 8);
    deft_put_le(b + 48, (uint64_t)h->per_epoch, 8);
    deft_put_le(b + 56, h->kind, 4);
    deft_put_le(b + 60, h->dtype, 4);
    deft_put_le(b + 64, h->opt_params, 4);
    deft_put_le(b + 68, h->accumulate, 4);
    deft_put_le(b + 72, (uint64_t)h->total, 8);
    deft_put_le(b + 80, (uint64_t)h->c.updates, 8);
    deft_put_le(b + 88, (uint32_t)h->c.micro, 4);
    deft_put_le(b + 92, (uint32_t)h->c.scaling_started, 4);
    deft_put_le(b + 96, deft_f64_bits(h->c.lr), 8);
    deft_put_le(b + 104, deft_f64_bits(h->c.last_norm), 8);
    deft_put_le(b + 112, deft_f32_bits(h->c.loss_scale), 4);
    deft_put_le(b + 116, (uint32_t)h->c.growth_tracker, 4);
    deft_put_le(b + 120, (uint64_t)h->c.skipped, 8);
    deft_put_le(b + 128, h->arrays, 4);
    if (!h->world) return;
    deft_put_le(b + 136, h->world, 4);
    deft_put_le(b + 140, h->rank, 4);
    deft_put_le(b + 144, (uint64_t)h->lo, 8);
    deft_put_le(b + 152, (uint64_t)h->hi, 8);
    deft_put_le(b + 160, (uint64_t)h->padded, 8);
}

/* The fields of a head whose magic, version and CRC were checked (version 2: b holds DEFT_TS_HEAD_BYTES_ZERO). */
static inline void deft_ts_head_decode(const unsigned char *b, uint32_t version, deft_ts_head *h) {
    memset(h, 0, sizeof *h);
    h->flags = (uint32_t)deft_get_le(b + 12, 4);
    h->n_params = (uint32_t)deft_get_le(b + 16, 4);
    h->runs = deft_get_le(b + 24, 8);
    h->epoch = (int64_t)deft_get_le(b + 32, 8);
    h->index = (int64_t)deft_get_le(b + 40, 8);
    h->per_epoch = (int64_t)deft_get_le(b + 48, 8);
    h->kind = (uint32_t)deft_get_le(b + 56, 4);
    h->dtype = (uint32_t)deft_get_le(b + 60, 4);
    h->opt_params = (uint32_t)deft_get_le(b + 64, 4);
    h->accumulate = (uint32_t)deft_get_le(b + 68, 4);
    h->total = (int64_t)deft_get_le(b + 72, 8);
    h->c.updates = (int64_t)deft_get_le(b + 80, 8);
    h->c.micro = (int32_t)(uint32_t)deft_get_le(b + 88, 4);
    h->c.scaling_started = (int)deft_get_le(b + 92, 4);
    h->c.lr = deft_bits_f64(deft_get_le(b + 96, 8));
    h->c.last_norm = deft_bits_f64(deft_get_le(b + 104, 8));
    h->c.loss_scale = deft_bits_f32((uint32_t)deft_get_le(b + 112, 4));
    h->c.growth_tracker = (int32_t)(uint32_t)deft_get_le(b + 116, 4);
    h->c.skipped = (int64_t)deft_get_le(b + 120, 8);
    h->arrays = (uint32_t)deft_get_le(b + 128, 4);
    if (version != DEFT_TS_VERSION_ZERO) return;
    h->world = (uint32_t)deft_get_le(b + 136, 4);
    h->rank = (uint32_t)deft_get_le(b + 140, 4);
    h->lo = (int64_t)deft_get_le(b + 144, 8);
    h->hi = (int64_t)deft_get_le(b + 152, 8);
    h->padded = (int64_t)deft_get_le(b + 160, 8);
}

/* The flat arrays a resume of opt needs, given the micro-batches into the current window: the gradients summed so far
 * (mid-window only), and the state its updates read (SGD without momentum keeps none). */
static inline uint32_t deft_ts_arrays_needed(const deft_optimizer *opt, int32_t micro) {
    uint32_t m = micro != 0 ? 1u << DEFT_OPT_ARRAY_GRADS : 0u;
    if (opt->kind == DEFT_OPTIM_ADAMW) m |= 1u << DEFT_OPT_ARRAY_STATE0 | 1u << DEFT_OPT_ARRAY_STATE1;
    else if (opt->sgd.momentum != 0.0) m |= 1u << DEFT_OPT_ARRAY_STATE0;
    return m;
}

/* Parameter i's entry in the optimizer's list. */
static inline void deft_ts_entry_encode(const deft_optimizer *opt, int i, unsigned char *b) {
    const deft_tensor *t = opt->params[i];
    const deft_optimizer_group g = deft_optimizer_group_of(opt, i);
    const int64_t end = i + 1 < opt->n_params ? opt->offsets[i + 1] : opt->total;
    memset(b, 0, DEFT_TS_ENTRY_BYTES);
    memcpy(b, t->name, strlen(t->name));   /* at most 63 bytes: a node name */
    deft_put_le(b + DEFT_TS_NAME_BYTES, (uint64_t)opt->offsets[i], 8);
    deft_put_le(b + DEFT_TS_NAME_BYTES + 8, (uint64_t)(end - opt->offsets[i]), 8);
    deft_put_le(b + DEFT_TS_NAME_BYTES + 16, deft_f64_bits(g.weight_decay), 8);
    deft_put_le(b + DEFT_TS_NAME_BYTES + 24, deft_f64_bits(g.lr_scale), 8);
}

/* data/train_state.c, for saving and loading alike: the arguments checked (`who` names the caller), and the head
 * read with its magic, version and CRC checked (DEFT_ERR_IO otherwise). */
deft_status deft_ts_check_args(const char *who, const char *path, const deft_program *p, const deft_optimizer *opt);
deft_status deft_ts_read_head(deft_file_reader *r, deft_ts_head *h);

/* Names for messages. */
static inline const char *deft_ts_kind_name(uint32_t kind) {
    return kind == DEFT_OPTIM_SGD ? "SGD" : kind == DEFT_OPTIM_ADAMW ? "AdamW" : "an unknown kind";
}

static inline const char *deft_ts_array_name(const deft_optimizer *opt, int a) {
    if (a == DEFT_OPT_ARRAY_GRADS) return "the accumulated gradients";
    if (a == DEFT_OPT_ARRAY_STATE1) return "AdamW's second moments";
    return opt->kind == DEFT_OPTIM_ADAMW ? "AdamW's first moments" : "SGD's momentum buffer";
}

#endif
