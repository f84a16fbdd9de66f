/* The norm's blocks of an optimizer, and the parts of its step that optimizer in backward runs as nodes of their own
 * (ir/optimizer.h explains both). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"

deft_status deft_optimizer_blocks_init(deft_optimizer *opt) {
    /* At most about DEFT_OPTIMIZER_STEP_BLOCKS blocks of whole runs, plus one partial block per parameter: on a GPU
     * each is one thread block of the step, and the large MLP's step needed several per SM to keep enough loads in
     * flight (bench/RESULTS.md, "Third round"). A multiple of four elements, so that every block of a parameter that
     * starts on a 16-byte boundary does too (the GPU's step then moves four f32 elements per load). */
    int64_t chunk = (opt->total + DEFT_OPTIMIZER_STEP_BLOCKS - 1) / DEFT_OPTIMIZER_STEP_BLOCKS;
    chunk = (chunk + 3) / 4 * 4;
    opt->chunk = chunk < DEFT_OPTIMIZER_BLOCK_MIN ? DEFT_OPTIMIZER_BLOCK_MIN : chunk;
    opt->block_first = malloc((size_t)(opt->n_params + 1) * sizeof *opt->block_first);
    if (!opt->block_first) return deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
    int64_t n = 0;
    for (int i = 0; i < opt->n_params; i++) {
        opt->block_first[i] = (int)n;
        const int64_t elems = deft_shape_numel(opt->params[i]->ndim, opt->params[i]->shape);
        n += (elems + opt->chunk - 1) / opt->chunk;
        if (n > (int64_t)1 << 30) return deft_set_error(DEFT_ERR_INVALID, "optimizer: too many norm blocks");
    }
    opt->block_first[opt->n_params] = (int)n;
    opt->n_blocks = (int)n;
    return DEFT_OK;
}

/* A part borrows everything from whole but its own gather tables (and, for a finisher, the pieces' list). */
static deft_optimizer *deft_part_new(deft_optimizer *whole) {
    deft_optimizer **grown = realloc(whole->parts, (size_t)(whole->n_parts + 1) * sizeof *grown);
    deft_optimizer *o = calloc(1, sizeof *o);
    deft_optimizer_part *part = calloc(1, sizeof *part);
    if (grown) whole->parts = grown;
    if (!grown || !o || !part) {
        free(o);
        free(part);
        deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
        return NULL;
    }
    o->graph = whole->graph;
    o->kind = whole->kind;
    o->sgd = whole->sgd;
    o->adamw = whole->adamw;
    o->accumulate_steps = 1;
    o->lr = whole->lr;
    o->dtype = whole->dtype;
    o->device = whole->device;
    o->last_norm = NAN;
    o->step_node = whole->step_node;
    o->scaler.scale = 1.0f;
    part->whole = whole;
    o->part = part;
    whole->parts[whole->n_parts++] = o;
    return o;
}

deft_optimizer *deft_optimizer_piece(deft_optimizer *whole, int first, int n) {
    for (int i = 0; i < whole->n_parts; i++) {
        deft_optimizer *o = whole->parts[i];
        if (!o->part->finisher && o->part->first_param == first && o->n_params == n) return o;
    }
    deft_optimizer *o = deft_part_new(whole);
    if (!o) return NULL;
    o->n_params = n;
    o->params = whole->params + first;
    o->offsets = whole->offsets + first;
    o->total = (first + n < whole->n_params ? whole->offsets[first + n] : whole->total) - whole->offsets[first];
    o->part->first_param = first;
    o->part->first_block = whole->block_first[first];
    o->part->n_blocks = whole->block_first[first + n] - whole->block_first[first];
    return o;
}

static bool deft_same_pieces(const deft_optimizer_part *f, const int *firsts, int n_pieces) {
    return f->finisher && f->n_pieces == n_pieces &&
           memcmp(f->piece_first_param, firsts, (size_t)n_pieces * sizeof *firsts) == 0;
}

deft_optimizer *deft_optimizer_finisher(deft_optimizer *whole, const int *firsts, int n_pieces) {
    for (int i = 0; i < whole->n_parts; i++)
        if (deft_same_pieces(whole->parts[i]->part, firsts, n_pieces)) return whole->parts[i];
    int *first = malloc((size_t)n_pieces * sizeof *first), *count = malloc((size_t)n_pieces * sizeof *count);
    deft_optimizer *o = first && count ? deft_part_new(whole) : NULL;
    if (!o) {
        free(first);
        free(count);
        if (!first || !count) deft_set_error(DEFT_ERR_OOM, "optimizer: out of host memory");
        return NULL;
    }
    for (int k = 0; k < n_pieces; k++) {
        first[k] = firsts[k];
        count[k] = (k + 1 < n_pieces ? firsts[k + 1] : whole->n_params) - firsts[k];
    }
    o->part->finisher = true;
    o->part->n_pieces = n_pieces;
    o->part->piece_first_param = first;
    o->part->piece_n_params = count;
    o->part->n_blocks = whole->n_blocks;
    return o;
}

/* Called by deft_optimizer_destroy, after the runtime gave back the parts' gather tables. */
void deft_optimizer_parts_free(deft_optimizer *whole) {
    for (int i = 0; i < whole->n_parts; i++) {
        deft_optimizer *o = whole->parts[i];
        for (int k = 0; k < o->n_gathers; k++) {
            free(o->gathers[k].grads);
            free(o->gathers[k].dtypes);
        }
        free(o->part->piece_first_param);
        free(o->part->piece_n_params);
        free(o->part);
        free(o);
    }
    free(whole->parts);
    whole->parts = NULL;
    whole->n_parts = 0;
}
