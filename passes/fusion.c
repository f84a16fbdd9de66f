/* Fusion: on a GPU, nodes that can run as one kernel become a group that runs at its last member's step.
 *
 *   matmul groups   a matmul and the bias add (and ReLU) after it, as one cuBLASLt call with an epilogue; or a
 *                   matmul and the sum over the rows of its second operand (a bias gradient), which cuBLASLt computes
 *                   while it reads that operand. A linear layer on [B, T, C] takes part too: its product is one 2-d
 *                   product over the stacked rows, and its weight gradient reads dy [B, T, N] flattened, whose sum over
 *                   B and T is the bias gradient
 *   batches         products of one shape, each too small to fill the GPU, that nothing reads before the last of
 *                   them: an MLP's weight gradients, as one cuBLASLt call (passes/fusion_batch.c)
 *   batch norm      a normalisation and the add and ReLU after it (passes/fusion_norm.c); its backward nodes
 *                   and the ReLU gradient they read, masked on load (passes/fusion_norm_grad.c)
 *   layer norm      a residual add and the layer norm reading it; layer norm's dx and the add of the residual
 *                   gradient to it (passes/fusion_layer_norm.c)
 *   casts           the casts of parameters and constants to one dtype (autocast's weights), in one launch
 *                   (passes/fusion_casts.c)
 *   pairs           cross-entropy's loss and gradient; an activation recomputed in the backward pass and its
 *                   gradient: each pair one pass over the operand both read (passes/fusion_pairs.c)
 *   elementwise     a chain of same-shape elementwise nodes in f32, bf16 or f16, casts between them included
 *                   (ops/fused.h): one pass over memory instead of one per node, and the members read only inside
 *                   the chain never get a buffer; a sum or mean over every element of the chain may end it (a loss's
 *                   mean: one launch fewer in a small step). Under bf16 autocast this joins, in a ResNet's
 *                   backward pass, the sum of two branches' gradients and the ReLU's gradient.
 *
 * A group runs at the position of its last member in the schedule (a group of casts at its first's), so every
 * reader outside the group of any member must come later than that; a node joins a group only if this holds (which
 * also rules out cycles through nodes outside the group). Fused kernels compute what the one-op kernels would, bit
 * for bit; the compile option no_fusion turns the pass off. CPU steps are never fused. */
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "cuda_matmul.h"
#include "fused.h"
#include "fusion_internal.h"

static const deft_tensor *deft_node(const deft_fusion *f, int id) { return f->p->graph->nodes[id]; }

bool deft_is_step(const deft_fusion *f, int id) {
    const deft_node_state *s = &f->p->nodes[id];
    return s->needed && !deft_op_is_leaf(deft_node(f, id)->op) && !deft_node(f, id)->is_view;
}

/* Consumers among the needed nodes, and each node's position. */
static deft_status deft_fusion_index(deft_fusion *f) {
    deft_program *p = f->p;
    const int n = p->n_nodes;
    f->pos = malloc((size_t)n * sizeof *f->pos);
    f->cons_start = calloc((size_t)n + 1, sizeof *f->cons_start);
    f->group_of = malloc((size_t)n * sizeof *f->group_of);
    if (!f->pos || !f->cons_start || !f->group_of) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    int total = 0;
    for (int id = 0; id < n; id++) {
        f->group_of[id] = -1;
        if (!p->nodes[id].needed) continue;
        const deft_tensor *t = deft_node(f, id);
        for (int k = 0; k < t->nsrc; k++) f->cons_start[t->src[k]->id + 1]++;
        total += t->nsrc;
    }
    for (int id = 0; id < n; id++) f->cons_start[id + 1] += f->cons_start[id];
    f->cons = malloc((size_t)(total ? total : 1) * sizeof *f->cons);
    int *fill = malloc((size_t)(n ? n : 1) * sizeof *fill);
    if (!f->cons || !fill) {
        free(fill);
        return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    }
    memcpy(fill, f->cons_start, (size_t)n * sizeof *fill);
    for (int id = 0; id < n; id++) {
        if (!p->nodes[id].needed) continue;
        const deft_tensor *t = deft_node(f, id);
        for (int k = 0; k < t->nsrc; k++) f->cons[fill[t->src[k]->id]++] = id;
    }
    free(fill);
    deft_fusion_positions(f);
    return DEFT_OK;
}

void deft_fusion_positions(deft_fusion *f) {
    const deft_program *p = f->p;
    for (int id = 0; id < p->n_nodes; id++) f->pos[id] = p->n_steps;
    for (int i = 0; i < p->n_steps; i++) f->pos[p->steps[i]] = i;
    for (int id = p->n_nodes - 1; id >= 0; id--) {
        if (!p->nodes[id].needed || deft_is_step(f, id)) continue;
        for (int c = f->cons_start[id]; c < f->cons_start[id + 1]; c++)
            if (f->pos[f->cons[c]] < f->pos[id]) f->pos[id] = f->pos[f->cons[c]];
    }
}

deft_group *deft_group_add(deft_fusion *f, deft_group_kind kind) {
    deft_program *p = f->p;
    if (p->n_groups == f->cap_groups) {
        int cap = f->cap_groups ? 2 * f->cap_groups : 16;
        deft_group *g = realloc(p->groups, (size_t)cap * sizeof *g);
        if (!g) return NULL;
        p->groups = g;
        f->cap_groups = cap;
    }
    deft_group *g = &p->groups[p->n_groups++];
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->matmul = g->bias = g->root = g->reduce = -1;
    g->members = malloc(DEFT_FUSED_MAX_OPS * sizeof *g->members);
    if (!g->members) {
        p->n_groups--;
        return NULL;
    }
    return g;
}

void deft_group_join(deft_fusion *f, int gi, int id) {
    deft_group *g = &f->p->groups[gi];
    g->members[g->n_members++] = id;
    f->group_of[id] = gi;
}

bool deft_readers_after(const deft_fusion *f, int gi, int joining, int at) {
    const deft_group *g = &f->p->groups[gi];
    for (int m = 0; m < g->n_members; m++) {
        const int u = g->members[m];
        for (int c = f->cons_start[u]; c < f->cons_start[u + 1]; c++) {
            const int r = f->cons[c];
            if (r != joining && f->group_of[r] != gi && f->pos[r] <= at) return false;
        }
    }
    return true;
}

static bool deft_same_shape(const deft_tensor *a, const deft_tensor *b) {
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]);
}

/* ---------------------------------------------------------------- matmul groups */
#ifdef DEFT_HAVE_CUDA
static bool deft_single_reader(const deft_fusion *f, int id, int reader) {
    return !f->p->nodes[id].is_output && f->cons_start[id + 1] - f->cons_start[id] == 1 &&
           f->cons[f->cons_start[id]] == reader;
}

/* A vector over the product's last dim: [N], or [1, ..., 1, N] of no more dims than the product. */
static bool deft_is_bias_for(const deft_tensor *bias, const deft_tensor *mm) {
    const int64_t n = mm->shape[mm->ndim - 1];
    return bias->dtype == mm->dtype && bias->ndim >= 1 && bias->ndim <= mm->ndim &&
           bias->shape[bias->ndim - 1] == n && deft_shape_numel(bias->ndim, bias->shape) == n;
}

/* matmul -> add(bias) [-> relu]: the add (or relu) is the root. */
static deft_status deft_fuse_bias(deft_fusion *f, int m) {
    const deft_tensor *mm = deft_node(f, m);
    const int c0 = f->cons_start[m];
    /* A product read by nothing (an output, dx of a linear layer on [B, T, C]) has no cons[c0] to look at. */
    if (f->cons_start[m + 1] - c0 != 1 || !deft_single_reader(f, m, f->cons[c0])) return DEFT_OK;
    const int a = f->cons[c0];
    const deft_tensor *add = deft_node(f, a);
    if (add->op != DEFT_OP_ADD || !deft_is_step(f, a) || f->group_of[a] >= 0 || !deft_same_shape(add, mm))
        return DEFT_OK;
    const deft_tensor *bias = add->src[0]->id == m ? add->src[1] : add->src[0];
    if (bias->id == m || !deft_is_bias_for(bias, mm)) return DEFT_OK;
    int relu = -1;
    if (f->cons_start[a + 1] - f->cons_start[a] == 1 && !f->p->nodes[a].is_output) {
        const int r = f->cons[f->cons_start[a]];
        if (deft_node(f, r)->op == DEFT_OP_RELU && deft_is_step(f, r) && f->group_of[r] < 0 &&
            deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_BIAS_RELU, f->p->cuda_flags))
            relu = r;
    }
    if (relu < 0 && !deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_BIAS, f->p->cuda_flags)) return DEFT_OK;
    deft_group *g = deft_group_add(f, DEFT_GROUP_MATMUL);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = f->p->n_groups - 1;
    g->matmul = m;
    g->bias = bias->id;
    g->epilogue = relu >= 0 ? DEFT_MM_EPI_BIAS_RELU : DEFT_MM_EPI_BIAS;
    deft_group_join(f, gi, m);
    deft_group_join(f, gi, a);
    if (relu >= 0) deft_group_join(f, gi, relu);
    return DEFT_OK;
}

/* Whether b is y [..., N] flattened to [rows, N] in place: the reshape view through which autodiff's weight gradient
 * of a linear layer on [B, T, C] reads dy (ir/autodiff_rules.c). */
static bool deft_flattens(const deft_tensor *b, const deft_tensor *y) {
    return b->is_view && b->op == DEFT_OP_RESHAPE && b->view_offset == 0 && b->src[0] == y && b->ndim == 2 &&
           y->ndim >= 2 && y->shape[y->ndim - 1] == b->shape[1];
}

/* The sum over k of op(b)[k, n]: b [K, N] summed over axis 0, or b [N, K] (transposed) over axis 1; or, b being y
 * [..., N] flattened (untransposed), y summed over every axis but the last, the same sum. */
bool deft_is_bias_grad_of(const deft_tensor *s, const deft_tensor *mm) {
    const deft_tensor *b = mm->src[1], *y = s->src[0];
    if (s->op != DEFT_OP_SUM || mm->ndim != 2 || b->ndim != 2 || s->dtype != mm->dtype ||
        deft_shape_numel(s->ndim, s->shape) != mm->shape[1])
        return false;
    if (y == b) return s->p.reduce.mask == (mm->p.matmul.trans_b ? 2u : 1u);
    return !mm->p.matmul.trans_b && deft_flattens(b, y) && s->p.reduce.mask == (1u << (y->ndim - 1)) - 1u;
}

int deft_find_bias_grad(const deft_fusion *f, int m) {
    const deft_tensor *mm = deft_node(f, m), *b = mm->src[1];
    const int reads[2] = {b->id, b->is_view && b->op == DEFT_OP_RESHAPE ? b->src[0]->id : -1};
    for (int r = 0; r < 2 && reads[r] >= 0; r++)
        for (int c = f->cons_start[reads[r]]; c < f->cons_start[reads[r] + 1]; c++) {
            const int s = f->cons[c];
            if (s != m && f->group_of[s] < 0 && deft_is_step(f, s) && deft_is_bias_grad_of(deft_node(f, s), mm))
                return s;
        }
    return -1;
}

/* matmul + sum of its second operand's rows: whichever runs later is the root. */
static deft_status deft_fuse_bias_grad(deft_fusion *f, int m) {
    const deft_tensor *mm = deft_node(f, m);
    const int s = deft_find_bias_grad(f, m);
    if (s < 0 || !deft_cuda_matmul_fusable(mm, DEFT_MM_EPI_BGRAD_B, f->p->cuda_flags)) return DEFT_OK;
    deft_group *g = deft_group_add(f, DEFT_GROUP_MATMUL);
    if (!g) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    const int gi = f->p->n_groups - 1;
    g->matmul = m;
    g->epilogue = DEFT_MM_EPI_BGRAD_B;
    deft_group_join(f, gi, m < s ? m : s);
    deft_group_join(f, gi, m < s ? s : m);
    const int at = f->pos[m] > f->pos[s] ? f->pos[m] : f->pos[s];
    if (!deft_readers_after(f, gi, -1, at)) {   /* a reader of the earlier one runs before the later one */
        f->group_of[m] = f->group_of[s] = -1;
        free(g->members);
        f->p->n_groups--;
    }
    return DEFT_OK;
}

static deft_status deft_fuse_matmuls(deft_fusion *f) {
    for (int i = 0; i < f->p->n_steps; i++) {
        const int m = f->p->steps[i];
        const deft_tensor *mm = deft_node(f, m);
        if (mm->op != DEFT_OP_MATMUL || mm->device.type != DEFT_CUDA || f->group_of[m] >= 0)
            continue;
        deft_status s = deft_fuse_bias(f, m);
        if (s == DEFT_OK && f->group_of[m] < 0) s = deft_fuse_bias_grad(f, m);
        if (s != DEFT_OK) return s;
    }
    return DEFT_OK;
}
#else
static deft_status deft_fuse_matmuls(deft_fusion *f) {
    (void)f;
    return DEFT_OK;
}
#endif

/* ---------------------------------------------------------------- elementwise chains */
static bool deft_act_fusable(deft_op act) {
    return act == DEFT_OP_RELU || act == DEFT_OP_GELU || act == DEFT_OP_GELU_TANH || act == DEFT_OP_SILU ||
           act == DEFT_OP_TANH || act == DEFT_OP_SIGMOID;
}

/* bf16 and f16 chains fuse only with the compile option fuse_low_precision: the fused kernel, whose register file
 * for eight elements of every member lives in local memory, ran bf16 ResNet-18 steps slower than the one-op kernels
 * (bench/RESULTS.md, "Fifth round"); f32 chains gained. */
static bool deft_fusion_dtype(const deft_fusion *f, deft_dtype dt) {
    if (dt == DEFT_F32) return true;
    return deft_fused_dtype_ok(dt) && f->p->config.fuse_low_precision;
}

static bool deft_elementwise_fusable(const deft_fusion *f, int id) {
    const deft_tensor *t = deft_node(f, id);
    if (!deft_is_step(f, id) || f->group_of[id] >= 0 || t->device.type != DEFT_CUDA ||
        !deft_fusion_dtype(f, t->dtype) || !deft_fused_supports(t->op) ||
        (t->op == DEFT_OP_ACT_GRAD && !deft_act_fusable(t->p.act)))
        return false;
    for (int k = 0; k < t->nsrc; k++)
        if (!deft_fusion_dtype(f, t->src[k]->dtype)) return false;
    return true;
}

/* Distinct nodes outside group gi (and not `joining`) that its members and `joining` read. */
static int deft_count_inputs(const deft_fusion *f, int gi, int joining) {
    const deft_group *g = &f->p->groups[gi];
    int seen[DEFT_FUSED_MAX_OPS * 2 + 2], n = 0;
    for (int m = 0; m <= g->n_members; m++) {
        const deft_tensor *t = deft_node(f, m < g->n_members ? g->members[m] : joining);
        for (int k = 0; k < t->nsrc; k++) {
            const int s = t->src[k]->id;
            if (f->group_of[s] == gi) continue;
            bool dup = false;
            for (int j = 0; j < n; j++) dup |= seen[j] == s;
            if (!dup) seen[n++] = s;
        }
    }
    return n;
}

/* Members read outside group gi (or outputs) once `joining` is in it; joining itself counts as one. */
static int deft_count_stores(const deft_fusion *f, int gi, int joining) {
    const deft_group *g = &f->p->groups[gi];
    int n = 1;
    for (int m = 0; m < g->n_members; m++) {
        const int u = g->members[m];
        bool out = f->p->nodes[u].is_output;
        for (int c = f->cons_start[u]; c < f->cons_start[u + 1] && !out; c++)
            out = f->cons[c] != joining && f->group_of[f->cons[c]] != gi;
        n += out;
    }
    return n;
}

/* Whether t reads the reduction ending group g: inside the kernel that register holds an element, not the sum. */
static bool deft_reads_reduction(const deft_group *g, const deft_tensor *t) {
    for (int k = 0; g->reduce >= 0 && k < t->nsrc; k++)
        if (t->src[k]->id == g->reduce) return true;
    return false;
}

/* A chain ending in a reduction stays open to nodes that do not read it: the backward pass of a loss (which
 * reads the loss's inputs, not its value) then joins the forward chain in one kernel. */
static bool deft_can_join(const deft_fusion *f, int gi, int id) {
    const deft_group *g = &f->p->groups[gi];
    if (g->kind != DEFT_GROUP_ELEMENTWISE || g->n_members >= DEFT_FUSED_MAX_OPS ||
        !deft_same_shape(deft_node(f, g->members[0]), deft_node(f, id)) || deft_reads_reduction(g, deft_node(f, id)))
        return false;
    return deft_readers_after(f, gi, id, f->pos[id]) && deft_count_inputs(f, gi, id) <= DEFT_FUSED_MAX_INPUTS &&
           deft_count_stores(f, gi, id) <= DEFT_FUSED_MAX_STORES;
}

/* A sum or mean of every element of a chain's member, small enough for the one-block fused kernel; of the
 * member's own dtype, as the one-op reduction is. */
static bool deft_is_chain_reduction(const deft_fusion *f, int id, int *gi) {
    const deft_tensor *t = deft_node(f, id);
    *gi = -1;
    if ((t->op != DEFT_OP_SUM && t->op != DEFT_OP_MEAN) || !deft_is_step(f, id) || f->group_of[id] >= 0 ||
        t->device.type != DEFT_CUDA || !deft_fusion_dtype(f, t->dtype) || t->src[0]->dtype != t->dtype ||
        deft_shape_numel(t->ndim, t->shape) != 1)
        return false;
    const deft_tensor *src = t->src[0];
    const int64_t n = deft_shape_numel(src->ndim, src->shape);
    *gi = f->group_of[src->id];
    return *gi >= 0 && n >= 1 && n <= DEFT_FUSED_MAX_REDUCE_NUMEL &&
           deft_same_shape(deft_node(f, f->p->groups[*gi].members[0]), src);
}

static deft_status deft_fuse_elementwise(deft_fusion *f) {
    for (int i = 0; i < f->p->n_steps; i++) {
        const int id = f->p->steps[i];
        int rg;
        if (deft_is_chain_reduction(f, id, &rg)) {
            deft_group *g = &f->p->groups[rg];
            if (g->kind == DEFT_GROUP_ELEMENTWISE && g->reduce < 0 && g->n_members < DEFT_FUSED_MAX_OPS &&
                deft_readers_after(f, rg, id, f->pos[id]) && deft_count_inputs(f, rg, id) <= DEFT_FUSED_MAX_INPUTS &&
                deft_count_stores(f, rg, id) <= DEFT_FUSED_MAX_STORES) {
                deft_group_join(f, rg, id);
                g->reduce = id;
            }
            continue;
        }
        if (!deft_elementwise_fusable(f, id)) continue;
        const deft_tensor *t = deft_node(f, id);
        int gi = -1;
        for (int k = 0; k < t->nsrc && gi < 0; k++) {
            const int src_group = f->group_of[t->src[k]->id];
            if (src_group >= 0 && deft_can_join(f, src_group, id)) gi = src_group;
        }
        /* A node reading no chain may still join the chain of the step just before it (the start of a loss's
         * backward pass, right after the loss): the same elements, one launch fewer. */
        const int prev_group = i > 0 ? f->group_of[f->p->steps[i - 1]] : -1;
        if (gi < 0 && prev_group >= 0 && deft_can_join(f, prev_group, id)) gi = prev_group;
        if (gi < 0) {
            if (!deft_group_add(f, DEFT_GROUP_ELEMENTWISE)) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
            gi = f->p->n_groups - 1;
        }
        deft_group_join(f, gi, id);
    }
    return DEFT_OK;
}

/* ---------------------------------------------------------------- finishing the groups */
static int deft_register_of(const deft_group *g, int id) {
    for (int j = 0; j < g->n_inputs; j++)
        if (g->inputs[j] == id) return j;
    for (int m = 0; m < g->n_members; m++)
        if (g->members[m] == id) return g->n_inputs + m;
    return -1;
}

static void deft_fused_input(deft_fused_kernel *k, int j, const deft_tensor *in) {
    deft_broadcast_strides(in->ndim, in->shape, k->ndim, k->shape, k->strides[j]);
    const int64_t n = deft_shape_numel(in->ndim, in->shape);
    k->input_kind[j] = n == 1 ? DEFT_FUSED_IN_ONE : n == k->numel ? DEFT_FUSED_IN_SAME : DEFT_FUSED_IN_STRIDED;
    k->input_dtype[j] = (int32_t)in->dtype;
}

static deft_status deft_build_kernel(deft_fusion *f, deft_group *g) {
    deft_fused_kernel *k = calloc(1, sizeof *k);
    if (!k) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    g->kernel = k;
    /* The chain's shape: the root's, or the reduced operand's when a reduction ends the chain. */
    const deft_tensor *chain = g->reduce >= 0 ? deft_node(f, g->reduce)->src[0] : deft_node(f, g->root);
    k->ndim = chain->ndim;
    memcpy(k->shape, chain->shape, sizeof k->shape);
    k->numel = deft_shape_numel(chain->ndim, chain->shape);
    k->n_inputs = g->n_inputs;
    k->n_ops = g->n_members;
    k->n_stores = g->n_stores;
    for (int j = 0; j < g->n_inputs; j++) deft_fused_input(k, j, deft_node(f, g->inputs[j]));
    for (int m = 0; m < g->n_members; m++) {
        const deft_tensor *t = deft_node(f, g->members[m]);
        deft_fused_instr *in = &k->ops[m];
        in->op = (int32_t)t->op;
        in->act = t->op == DEFT_OP_ACT_GRAD ? (int32_t)t->p.act : 0;
        in->a = deft_register_of(g, t->src[0]->id);
        in->b = t->nsrc > 1 ? deft_register_of(g, t->src[1]->id) : in->a;
        in->dtype = (int32_t)t->dtype;
        in->scalar = deft_op_info_of(t->op)->kind == DEFT_KIND_SCALAR ? t->p.scalar : 0.0;
    }
    k->n_stores = g->n_stores - (g->reduce >= 0);   /* the reduction is the last store, written by its own path */
    for (int s = 0; s < g->n_stores; s++) k->store_dtype[s] = (int32_t)deft_node(f, g->stores[s])->dtype;
    for (int s = 0; s < k->n_stores; s++) k->store_reg[s] = deft_register_of(g, g->stores[s]);
    if (g->reduce >= 0) {
        k->reduce_op = (int32_t)deft_node(f, g->reduce)->op;
        k->reduce_reg = deft_register_of(g, g->reduce);   /* its instruction copies its operand's element */
    }
    return DEFT_OK;
}

static bool deft_read_outside(const deft_fusion *f, int gi, int u) {
    if (f->p->nodes[u].is_output) return true;
    for (int c = f->cons_start[u]; c < f->cons_start[u + 1]; c++)
        if (f->group_of[f->cons[c]] != gi) return true;
    return false;
}

static int deft_cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static deft_status deft_finish_group(deft_fusion *f, int gi) {
    deft_group *g = &f->p->groups[gi];
    qsort(g->members, (size_t)g->n_members, sizeof *g->members, deft_cmp_int);
    /* A group runs where its last member would; casts of leaves, whose inputs exist before any step, where the
     * first would, so that every member's readers still come after it. */
    const bool at_first = g->kind == DEFT_GROUP_CASTS;
    g->root = g->members[0];
    for (int m = 1; m < g->n_members; m++)
        if (at_first ? f->pos[g->members[m]] < f->pos[g->root] : f->pos[g->members[m]] > f->pos[g->root])
            g->root = g->members[m];
    g->stores = malloc((size_t)g->n_members * sizeof *g->stores);
    g->inputs = malloc((size_t)(DEFT_FUSED_MAX_INPUTS + 2) * sizeof *g->inputs);
    if (!g->stores || !g->inputs) return deft_set_error(DEFT_ERR_OOM, "compile: out of host memory");
    /* Batch norm's backward kernels each write their value whoever reads it: dx reads the sums from memory. */
    const bool all_but_mask = g->kind == DEFT_GROUP_NORM_GRAD;
    for (int m = 0; m < g->n_members; m++)
        if (g->members[m] != g->reduce &&
            (deft_read_outside(f, gi, g->members[m]) || (all_but_mask && g->members[m] != g->mask)))
            g->stores[g->n_stores++] = g->members[m];
    if (g->reduce >= 0) g->stores[g->n_stores++] = g->reduce;
    if (g->kind != DEFT_GROUP_ELEMENTWISE) return DEFT_OK;
    for (int m = 0; m < g->n_members; m++) {
        const deft_tensor *t = deft_node(f, g->members[m]);
        for (int k = 0; k < t->nsrc; k++)
            if (f->group_of[t->src[k]->id] != gi && deft_register_of(g, t->src[k]->id) < 0)
                g->inputs[g->n_inputs++] = t->src[k]->id;
    }
    return deft_build_kernel(f, g);
}

/* Singletons are not groups; the rest lose their members from the schedule but for the roots. */
static deft_status deft_fusion_commit(deft_fusion *f) {
    deft_program *p = f->p;
    int kept = 0;
    for (int gi = 0; gi < p->n_groups; gi++) {
        deft_group *g = &p->groups[gi];
        if (g->n_members < 2) {
            for (int m = 0; m < g->n_members; m++) f->group_of[g->members[m]] = -1;
            free(g->members);
            continue;
        }
        for (int m = 0; m < g->n_members; m++) f->group_of[g->members[m]] = kept;
        p->groups[kept++] = *g;
    }
    p->n_groups = kept;
    for (int gi = 0; gi < p->n_groups; gi++) {
        deft_status s = deft_finish_group(f, gi);
        if (s != DEFT_OK) return s;
    }
    int n = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const int id = p->steps[i], gi = f->group_of[id];
        if (gi < 0 || p->groups[gi].root == id) p->steps[n++] = id;
    }
    p->n_steps = n;
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = f->group_of[id];
    return DEFT_OK;
}

static bool deft_has_cuda_step(const deft_program *p) {
    for (int i = 0; i < p->n_steps; i++)
        if (p->graph->nodes[p->steps[i]]->device.type == DEFT_CUDA) return true;
    return false;
}

deft_status deft_program_fuse(deft_program *p) {
    for (int id = 0; id < p->n_nodes; id++) p->nodes[id].group = -1;
    if (!deft_has_cuda_step(p)) return DEFT_OK;
    deft_fusion f = {p, NULL, NULL, NULL, NULL, 0};
    deft_status s = deft_fusion_index(&f);
    if (s == DEFT_OK) s = deft_fuse_pairs(&f);
    if (s == DEFT_OK && p->config.product_batches) s = deft_fuse_product_batches(&f);
    if (s == DEFT_OK) s = deft_fuse_matmuls(&f);
    if (s == DEFT_OK) s = deft_fuse_norm_epilogues(&f);
    if (s == DEFT_OK) s = deft_fuse_norm_grads(&f);
    if (s == DEFT_OK) s = deft_fuse_layer_norms(&f);
    if (s == DEFT_OK) s = deft_fuse_leaf_casts(&f);
    if (s == DEFT_OK) s = deft_fuse_elementwise(&f);
    if (s == DEFT_OK) s = deft_fusion_commit(&f);
    free(f.pos);
    free(f.cons_start);
    free(f.cons);
    free(f.group_of);
    return s;
}

void deft_program_groups_free(deft_program *p) {
    for (int gi = 0; gi < p->n_groups; gi++) {
        free(p->groups[gi].members);
        free(p->groups[gi].inputs);
        free(p->groups[gi].stores);
        free(p->groups[gi].kernel);
    }
    free(p->groups);
    p->groups = NULL;
    p->n_groups = 0;
}
