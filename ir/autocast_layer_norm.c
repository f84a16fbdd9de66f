/* Layer norm under autocast, where only products read it. The policy runs layer norm in f32 (torch's fp32 list) and
 * a product reads its value cast to L (bf16 or f16). The backward nodes read the layer norm node for the row
 * statistics past its value, so the whole f32 value stayed alive from the forward pass to the backward pass beside
 * its L cast, which the product's weight gradient keeps too: in GPT-2 124M at batch 16, 25 f32 [16, 1024, 768]
 * values, 1.26 GB of activations that nothing reads, and a cast kernel each way per layer norm.
 *
 * Where every forward node reading the user's f32 layer norm is a product (or attention) that casts it to L, the
 * rewrite builds in place of that cast the layer norm again with its value in L (deft_layer_norm_as): the kernels
 * compute it in f32 as the f32 node does and round once on the store, which is the cast's round-to-nearest of the
 * f32 value, so the value has the same bits; its gradients read the L gradient as it is (exact in f32) where they
 * read its cast to f32 before, and give the same bits. The f32 node is then computed only if a program asks for it.
 * Anything else reading the f32 value (an f32 op, a view, a batch norm) leaves the layer norm as it was: the two
 * nodes would each differentiate, and dx would be summed in another order. */
#include <stdlib.h>
#include <stdio.h>

#include "autocast.h"
#include "build_grad_ops.h"
#include "config.h"
#include "node.h"

static bool deft_is_f32_ln(const deft_tensor *t) {
    return t->op == DEFT_OP_LAYER_NORM && t->dtype == DEFT_F32 && t->src[0]->dtype == DEFT_F32;
}

deft_status deft_autocast_find_ln_low(deft_autocast *ac, const deft_graph *g, const bool *bwd) {
    const size_t n = (size_t)(ac->n_user ? ac->n_user : 1);
    ac->ln_low = calloc(n, sizeof *ac->ln_low);
    bool *other = calloc(n, sizeof *other);
    if (!ac->ln_low || !other) {
        free(other);
        return deft_set_error(DEFT_ERR_OOM, "autocast: out of host memory");
    }
    if (deft_debug(DEFT_DEBUG_LN_WIDE)) {
        free(other);
        return DEFT_OK;
    }
    /* The nodes deft_rewrite_forward re-builds are the readers that count. */
    for (int id = 0; id < ac->n_user; id++) {
        const deft_tensor *r = g->nodes[id];
        if (bwd[id] || r->op == DEFT_OP_OPTIMIZER || r->autocast != DEFT_AUTOCAST_NONE) continue;
        const bool low = deft_autocast_reads_low(r);
        for (int k = 0; k < r->nsrc; k++) {
            const deft_tensor *s = r->src[k];
            if (s->id >= ac->n_user || !deft_is_f32_ln(s)) continue;
            if (low) ac->ln_low[s->id] = true;
            else other[s->id] = true;
        }
    }
    for (int id = 0; id < ac->n_user; id++) ac->ln_low[id] &= !other[id];
    free(other);
    return DEFT_OK;
}

/* x re-built with its value in the low dtype, from the same sources (f32 x, weight and bias). */
static deft_tensor *deft_ln_in_low(const deft_autocast *ac, deft_tensor *x) {
    deft_tensor *t = deft_layer_norm_as(x->src[0], deft_layer_norm_weight_of(x), deft_layer_norm_bias_of(x),
                                        x->p.ln.eps, ac->dtype);
    if (!t) return NULL;
    char name[64];
    snprintf(name, sizeof name, "%.52s.%s", x->name, deft_dtype_name(ac->dtype));
    deft_set_name(t, name);
    t->autocast = DEFT_AUTOCAST_NODE;
    return t;
}

deft_tensor *deft_autocast_low(deft_autocast *ac, const deft_tensor *u, deft_tensor *x) {
    if (!x || x->dtype == ac->dtype || !ac->ln_low || u->id >= ac->n_user || !ac->ln_low[u->id] ||
        !deft_is_f32_ln(x))
        return deft_autocast_cast(ac, x, ac->dtype);
    deft_tensor **slot = deft_autocast_memo(ac, x, ac->dtype);
    if (!slot) return NULL;
    if (!*slot) *slot = deft_ln_in_low(ac, x);
    return *slot;
}
