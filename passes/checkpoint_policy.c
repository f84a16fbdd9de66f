/* The fixed checkpoint policies: spans the user marked (torch.utils.checkpoint.checkpoint), segments of the forward
 * pass (torch.utils.checkpoint.checkpoint_sequential), and what every policy drops: autocast's casts of inputs, and
 * values one memory-bound pass makes again from a value the backward pass keeps anyway. */
#include <math.h>
#include <stdlib.h>

#include "autocast.h"
#include "checkpoint.h"
#include "node.h"

/* Marks every node on a path from `from` to `to`, both excluded: descendants of from that to depends on. */
deft_status deft_checkpoint_span(deft_tensor *from, deft_tensor *to) {
    if (!from || !to) return deft_set_error(DEFT_ERR_INVALID, "checkpoint_span: from or to is NULL");
    deft_graph *g = from->graph;
    if (to->graph != g) return deft_set_error(DEFT_ERR_INVALID, "checkpoint_span: from and to belong to different graphs");
    if (to->id <= from->id)
        return deft_set_error(DEFT_ERR_INVALID, "checkpoint_span: %s does not depend on %s", to->name, from->name);
    int n = to->id - from->id + 1;
    bool *below = calloc((size_t)n, sizeof *below), *above = calloc((size_t)n, sizeof *above);
    if (!below || !above) {
        free(below);
        free(above);
        return deft_set_error(DEFT_ERR_OOM, "checkpoint_span: out of host memory");
    }
    /* below: reachable from `from`; above: reaching `to`. Ids are a topological order, so two sweeps do. */
    below[0] = true;
    for (int i = 1; i < n; i++) {
        const deft_tensor *t = g->nodes[from->id + i];
        for (int k = 0; k < t->nsrc && !below[i]; k++) {
            int s = t->src[k]->id - from->id;
            below[i] = s >= 0 && below[s];
        }
    }
    above[n - 1] = true;
    for (int i = n - 1; i > 0; i--) {
        if (!above[i]) continue;
        const deft_tensor *t = g->nodes[from->id + i];
        for (int k = 0; k < t->nsrc; k++) {
            int s = t->src[k]->id - from->id;
            if (s >= 0) above[s] = true;
        }
    }
    deft_status st = below[n - 1] ? DEFT_OK
                                  : deft_set_error(DEFT_ERR_INVALID, "checkpoint_span: %s does not depend on %s",
                                                   to->name, from->name);
    for (int i = 1; st == DEFT_OK && i < n - 1; i++)
        if (below[i] && above[i]) g->nodes[from->id + i]->ckpt_marked = true;
    free(below);
    free(above);
    return st;
}

void deft_ckpt_drop_marked(const deft_ckpt_graph *a, bool *drop) {
    for (int i = 0; i < a->n_cands; i++)
        if (a->g->nodes[a->cands[i]]->ckpt_marked) drop[a->cands[i]] = true;
}

/* Positions in the forward steps (id order) after which nothing earlier is read later in the forward pass: the
 * boundaries a sequence of layers has. Writes cut[id] for the candidates that are such boundaries. */
static int deft_ckpt_cuts(const deft_ckpt_graph *a, bool *cut) {
    int *last = malloc((size_t)(a->n ? a->n : 1) * sizeof *last);
    if (!last) return 0;
    for (int id = 0; id < a->n; id++) last[id] = id;
    for (int id = 0; id < a->n; id++) {
        const deft_tensor *t = a->g->nodes[id];
        if (!a->needed[id] || !a->forward[id]) continue;
        for (int k = 0; k < t->nsrc; k++) {
            const deft_tensor *s = t->src[k];
            while (s->is_view) s = s->src[0];
            if (!deft_op_is_leaf(s->op) && last[s->id] < id) last[s->id] = id;
        }
    }
    int reach = -1, n_cuts = 0;
    for (int id = 0; id < a->n; id++) {
        if (!a->needed[id] || !a->forward[id] || deft_op_is_leaf(a->g->nodes[id]->op)) continue;
        cut[id] = a->candidate[id] && reach <= id;
        n_cuts += cut[id];
        if (last[id] > reach) reach = last[id];
    }
    free(last);
    return n_cuts;
}

/* The square root of the forward pass's weighted layers: matmuls and convolutions (a convolutional network has one
 * matmul, its classifier, and would otherwise get a single segment, which drops nothing). */
static int deft_ckpt_default_segments(const deft_ckpt_graph *a) {
    int layers = 0;
    for (int id = 0; id < a->n; id++) {
        const deft_op op = a->g->nodes[id]->op;
        layers += a->needed[id] && a->forward[id] && (op == DEFT_OP_MATMUL || op == DEFT_OP_CONV2D);
    }
    int s = (int)lround(sqrt((double)(layers > 0 ? layers : 1)));
    return s > 0 ? s : 1;
}

/* `segments` runs of the forward pass's boundaries (0: the square root of its weighted layers, rounded): every run but the
 * last keeps only the boundary it ends at; the last keeps everything, as checkpoint_sequential does. */
void deft_ckpt_drop_segments(const deft_ckpt_graph *a, int segments, bool *drop) {
    bool *cut = calloc((size_t)(a->n ? a->n : 1), sizeof *cut);
    if (!cut) return;
    int m = deft_ckpt_cuts(a, cut), *ids = malloc((size_t)(m ? m : 1) * sizeof *ids), k = 0;
    if (!ids) {
        free(cut);
        return;
    }
    for (int id = 0; id < a->n; id++)
        if (cut[id]) ids[k++] = id;
    if (segments <= 0) segments = deft_ckpt_default_segments(a);
    if (segments > m) segments = m;
    /* cut[] now marks the kept boundaries: the last cut of each segment but the last. */
    for (int id = 0; id < a->n; id++) cut[id] = false;
    int last_boundary = -1;
    for (int s = 1; s < segments; s++) {
        last_boundary = ids[(int)((int64_t)s * m / segments) - 1];
        cut[last_boundary] = true;
    }
    for (int i = 0; i < a->n_cands; i++)
        if (!cut[a->cands[i]] && a->cands[i] < last_boundary) drop[a->cands[i]] = true;
    free(ids);
    free(cut);
}

int deft_ckpt_input_casts(const deft_ckpt_graph *a, bool *recast) {
    int n = 0;
    for (int i = 0; i < a->n_cands; i++) {
        const deft_tensor *t = a->g->nodes[a->cands[i]];
        if (t->op != DEFT_OP_CAST || t->autocast != DEFT_AUTOCAST_CAST) continue;
        const deft_tensor *s = t->src[0];   /* through views, and casts (the CPU widens a low-type batch again) */
        while (s->is_view || (s->op == DEFT_OP_CAST && s->autocast == DEFT_AUTOCAST_CAST)) s = s->src[0];
        if (s->op != DEFT_OP_INPUT) continue;
        recast[t->id] = true;
        n++;
    }
    return n;
}

/* One pass over memory per element, no reduction: activations, casts and other one-input elementwise ops, permutes. */
static bool deft_ckpt_one_pass(const deft_tensor *t) {
    if (t->op == DEFT_OP_PERMUTE) return true;
    const deft_op_kind k = deft_op_info_of(t->op)->kind;
    return t->nsrc == 1 && (k == DEFT_KIND_UNARY || k == DEFT_KIND_CAST || k == DEFT_KIND_SCALAR);
}

/* A source the recomputation reads: one the backward pass keeps anyway (and not itself recomputed), or for a layer
 * norm's weight and bias a leaf. */
static bool deft_ckpt_kept_source(const deft_ckpt_graph *a, const deft_tensor *s, bool leaf_ok, const bool *cheap) {
    while (s->is_view) s = s->src[0];
    if (deft_op_is_leaf(s->op)) return leaf_ok;
    return a->read_late[s->id] && !cheap[s->id];
}

/* A layer norm whose input the backward pass keeps (its own gradient reads it): its kernel holds a row in registers,
 * so making the normalised value (and its row statistics) again is one read of the input and one write. In a
 * pre-norm transformer that is two values a block that a product's weight gradient would otherwise keep. */
static bool deft_ckpt_cheap_norm(const deft_ckpt_graph *a, const deft_tensor *t, const bool *cheap) {
    if (t->op != DEFT_OP_LAYER_NORM || !deft_ckpt_kept_source(a, t->src[0], false, cheap)) return false;
    for (int k = 1; k < t->nsrc; k++)
        if (!deft_ckpt_kept_source(a, t->src[k], true, cheap)) return false;
    return true;
}

int deft_ckpt_cheap_recomputes(const deft_ckpt_graph *a, bool *cheap) {
    int n = 0;
    for (int i = 0; i < a->n_cands; i++) {
        const deft_tensor *t = a->g->nodes[a->cands[i]];
        if (cheap[t->id]) continue;
        /* A parameter's cast is no activation (the weights' casts): only values computed from the batch. */
        const bool one_pass = deft_ckpt_one_pass(t) && deft_ckpt_kept_source(a, t->src[0], false, cheap);
        if (!one_pass && !deft_ckpt_cheap_norm(a, t, cheap)) continue;
        cheap[t->id] = true;
        n++;
    }
    return n;
}
