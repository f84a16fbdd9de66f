/* Attention on the CPU: the blocked reference of FlashAttention. Per (batch, head) and tile of query rows, the keys
 * are walked a tile at a time with an online softmax (a running maximum and sum rescale what was accumulated), so no
 * T x T matrix exists anywhere; the forward writes each row's log-sum-exp past the output (graph_internal.h's
 * deft_node_extra_bytes). The backward recomputes the probabilities from it tile by tile, in two passes without
 * any shared accumulation: dq per query tile, then dk and dv per key tile; so it is deterministic. Tiles are
 * converted to double on load (every dtype; halves widen exactly), accumulate in double and round once on store.
 * Both layouts (q, k, v apart, or packed in one [B, T, 3C]: graph_internal.h's deft_attention_layout_of) run this
 * code, the rows found through element strides: the same sums in the same order, so the same bits either way. */
#include <string.h>

#include "cpu_internal.h"

#define DEFT_ATT_TILE 16   /* rows of queries or keys per tile: small enough for a thread's stack at D = 128 */
#define DEFT_ATT_DMAX DEFT_ATTENTION_MAX_HEAD

typedef struct deft_att {
    int64_t bh, h, t, d;     /* batch * heads, heads, sequence, head size */
    deft_attention_layout l; /* where q, k, v (dq, dk, dv) and the output (dout) keep their rows */
    double scale;
    int causal;
    deft_dtype dt;           /* of q, k, v, the output and the gradients */
    deft_dtype st;           /* of the statistics: f64 for f64, f32 otherwise */
} deft_att;

static deft_att deft_att_of(const deft_tensor *n) {
    const deft_attention_dims d = deft_attention_dims_of(n);
    return (deft_att){d.b * d.h, d.h, d.t, d.d, deft_attention_layout_of(n), n->p.attn.scale, n->p.attn.causal,
                      n->dtype, n->dtype == DEFT_F64 ? DEFT_F64 : DEFT_F32};
}

/* The element offset of row `row` of (batch * head) bh in a matrix of strides s. */
static int64_t deft_att_at(const deft_att *a, const deft_attention_strides *s, int64_t bh, int64_t row) {
    return bh / a->h * s->sb + bh % a->h * s->sh + row * s->st;
}

/* rows [row0, row0 + rows) of matrix m (one (batch, head) of a tensor of strides s) into tile[rows][D] */
static void deft_att_load(const deft_att *a, const void *m, const deft_attention_strides *s, int64_t bh,
                          int64_t row0, int rows, double tile[][DEFT_ATT_DMAX]) {
    for (int i = 0; i < rows; i++) {
        const int64_t at = deft_att_at(a, s, bh, row0 + i);
        if (a->dt == DEFT_F32)
            for (int64_t c = 0; c < a->d; c++) tile[i][c] = ((const float *)m)[at + c];
        else if (a->dt == DEFT_F64) memcpy(tile[i], (const double *)m + at, (size_t)a->d * sizeof(double));
        else
            for (int64_t c = 0; c < a->d; c++) tile[i][c] = deft_load_as_f64(m, a->dt, at + c);
    }
}

static void deft_att_store(const deft_att *a, void *m, const deft_attention_strides *s, int64_t bh, int64_t row0,
                           int rows, double tile[][DEFT_ATT_DMAX]) {
    for (int i = 0; i < rows; i++) {
        const int64_t at = deft_att_at(a, s, bh, row0 + i);
        for (int64_t c = 0; c < a->d; c++) deft_store_from_f64(m, a->dt, at + c, tile[i][c]);
    }
}

static double deft_att_dot(const double *x, const double *y, int64_t d) {
    double s = 0.0;
    for (int64_t c = 0; c < d; c++) s += x[c] * y[c];
    return s;
}

static int deft_att_rows(const deft_att *a, int64_t row0) {
    return (int)(a->t - row0 < DEFT_ATT_TILE ? a->t - row0 : DEFT_ATT_TILE);
}

/* scale * q . k for query row qi and key row kj, or -inf where the causal mask hides the key */
static double deft_att_score(const deft_att *a, const double *q, const double *k, int64_t qi, int64_t kj) {
    if (a->causal && kj > qi) return -INFINITY;
    return a->scale * deft_att_dot(q, k, a->d);
}

/* Folds one key tile into the running maximum m, sum l and accumulator acc of each query row. */
static void deft_att_fold(const deft_att *a, int64_t q0, int qn, int64_t k0, int kn, double q[][DEFT_ATT_DMAX],
                          double k[][DEFT_ATT_DMAX], double v[][DEFT_ATT_DMAX], double *m, double *l,
                          double acc[][DEFT_ATT_DMAX]) {
    for (int i = 0; i < qn; i++) {
        double s[DEFT_ATT_TILE], mx = m[i];
        for (int j = 0; j < kn; j++) {
            s[j] = deft_att_score(a, q[i], k[j], q0 + i, k0 + j);
            if (s[j] > mx) mx = s[j];
        }
        if (mx == -INFINITY) continue;   /* every key of the tile is masked and none came before */
        const double corr = exp(m[i] - mx);   /* 0 while m is still -inf */
        l[i] *= corr;
        for (int64_t c = 0; c < a->d; c++) acc[i][c] *= corr;
        for (int j = 0; j < kn; j++) {
            const double p = exp(s[j] - mx);
            l[i] += p;
            for (int64_t c = 0; c < a->d; c++) acc[i][c] += p * v[j][c];
        }
        m[i] = mx;
    }
}

/* Keys a query tile starting at q0 with qn rows sees: all, or (causal) those up to its last row. */
static int64_t deft_att_key_end(const deft_att *a, int64_t q0, int qn) { return a->causal ? q0 + qn : a->t; }

static void deft_att_forward_tile(const deft_att *a, const void *qm, const void *km, const void *vm, void *out,
                                  void *lse, int64_t bh, int64_t q0) {
    double q[DEFT_ATT_TILE][DEFT_ATT_DMAX], k[DEFT_ATT_TILE][DEFT_ATT_DMAX], v[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    double acc[DEFT_ATT_TILE][DEFT_ATT_DMAX], m[DEFT_ATT_TILE], l[DEFT_ATT_TILE];
    const int qn = deft_att_rows(a, q0);
    deft_att_load(a, qm, &a->l.qkv, bh, q0, qn, q);
    for (int i = 0; i < qn; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0;
        for (int64_t c = 0; c < a->d; c++) acc[i][c] = 0.0;
    }
    const int64_t kend = deft_att_key_end(a, q0, qn);
    for (int64_t k0 = 0; k0 < kend; k0 += DEFT_ATT_TILE) {
        const int kn = (int)(kend - k0 < DEFT_ATT_TILE ? kend - k0 : DEFT_ATT_TILE);
        deft_att_load(a, km, &a->l.qkv, bh, k0, kn, k);
        deft_att_load(a, vm, &a->l.qkv, bh, k0, kn, v);
        deft_att_fold(a, q0, qn, k0, kn, q, k, v, m, l, acc);
    }
    for (int i = 0; i < qn; i++) {
        for (int64_t c = 0; c < a->d; c++) acc[i][c] /= l[i];
        deft_store_from_f64(lse, a->st, bh * a->t + q0 + i, m[i] + log(l[i]));
    }
    deft_att_store(a, out, &a->l.out, bh, q0, qn, acc);
}

static int64_t deft_att_tiles(const deft_att *a) { return (a->t + DEFT_ATT_TILE - 1) / DEFT_ATT_TILE; }

/* q, k and v: three sources, or the thirds of one (packed) */
static void deft_att_qkv(const deft_att *a, const deft_tensor *n, const void *const *src, const void **qkv) {
    const size_t part = (size_t)a->l.part * deft_dtype_size(a->dt);
    for (int i = 0; i < 3; i++) qkv[i] = n->p.attn.heads > 0 ? (const char *)src[0] + i * part : src[i];
}

static deft_status deft_cpu_attention_forward(const deft_tensor *n, void *out, const void *const *in) {
    const deft_att a = deft_att_of(n);
    void *lse = (char *)out + deft_node_extra_offset(n);
    const void *qkv[3];
    deft_att_qkv(&a, n, in, qkv);
    const int64_t tiles = deft_att_tiles(&a), work = a.bh * tiles;
    DEFT_OMP(parallel for schedule(dynamic) if (work > 1 && a.bh * a.t * a.t * a.d >= DEFT_CPU_PAR_MIN))
    for (int64_t w = 0; w < work; w++)
        deft_att_forward_tile(&a, qkv[0], qkv[1], qkv[2], out, lse, w / tiles, (w % tiles) * DEFT_ATT_TILE);
    return DEFT_OK;
}

/* ---- backward: src (dout, q, k, v, out) or (dout, qkv, out); value dq, dk, dv; statistics rowsum(dout * out) ---- */

typedef struct deft_att_grad_in {
    const void *dout, *q, *k, *v, *out, *lse;
    void *dq, *dk, *dv, *delta;
} deft_att_grad_in;

static void deft_att_delta_tile(const deft_att *a, const deft_att_grad_in *g, int64_t bh, int64_t q0) {
    double dout[DEFT_ATT_TILE][DEFT_ATT_DMAX], o[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    const int qn = deft_att_rows(a, q0);
    deft_att_load(a, g->dout, &a->l.out, bh, q0, qn, dout);
    deft_att_load(a, g->out, &a->l.out, bh, q0, qn, o);
    for (int i = 0; i < qn; i++)
        deft_store_from_f64(g->delta, a->st, bh * a->t + q0 + i, deft_att_dot(dout[i], o[i], a->d));
}

/* What a (query tile, key tile) pair shares: the rows' statistics and the tiles. */
typedef struct deft_att_pair {
    double q[DEFT_ATT_TILE][DEFT_ATT_DMAX], dout[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    double k[DEFT_ATT_TILE][DEFT_ATT_DMAX], v[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    double lse[DEFT_ATT_TILE], delta[DEFT_ATT_TILE];
    int64_t q0, k0;
    int qn, kn;
} deft_att_pair;

static void deft_att_load_queries(const deft_att *a, const deft_att_grad_in *g, int64_t bh, int64_t q0,
                                  deft_att_pair *t) {
    t->q0 = q0;
    t->qn = deft_att_rows(a, q0);
    deft_att_load(a, g->q, &a->l.qkv, bh, q0, t->qn, t->q);
    deft_att_load(a, g->dout, &a->l.out, bh, q0, t->qn, t->dout);
    for (int i = 0; i < t->qn; i++) {
        t->lse[i] = deft_load_as_f64(g->lse, a->st, bh * a->t + q0 + i);
        t->delta[i] = deft_load_as_f64(g->delta, a->st, bh * a->t + q0 + i);
    }
}

static void deft_att_load_keys(const deft_att *a, const deft_att_grad_in *g, int64_t bh, int64_t k0, int64_t kend,
                               deft_att_pair *t) {
    t->k0 = k0;
    t->kn = (int)(kend - k0 < DEFT_ATT_TILE ? kend - k0 : DEFT_ATT_TILE);
    deft_att_load(a, g->k, &a->l.qkv, bh, k0, t->kn, t->k);
    deft_att_load(a, g->v, &a->l.qkv, bh, k0, t->kn, t->v);
}

/* p = exp(s - lse) and ds = p * (dout . v - delta) of query row i and key row j of the pair. */
static void deft_att_probs(const deft_att *a, const deft_att_pair *t, int i, int j, double *p, double *ds) {
    const double s = deft_att_score(a, t->q[i], t->k[j], t->q0 + i, t->k0 + j);
    *p = s == -INFINITY ? 0.0 : exp(s - t->lse[i]);
    *ds = *p * (deft_att_dot(t->dout[i], t->v[j], a->d) - t->delta[i]);
}

static void deft_att_dq_tile(const deft_att *a, const deft_att_grad_in *g, int64_t bh, int64_t q0) {
    deft_att_pair t;
    double dq[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    deft_att_load_queries(a, g, bh, q0, &t);
    for (int i = 0; i < t.qn; i++)
        for (int64_t c = 0; c < a->d; c++) dq[i][c] = 0.0;
    const int64_t kend = deft_att_key_end(a, q0, t.qn);
    for (int64_t k0 = 0; k0 < kend; k0 += DEFT_ATT_TILE) {
        deft_att_load_keys(a, g, bh, k0, kend, &t);
        for (int i = 0; i < t.qn; i++)
            for (int j = 0; j < t.kn; j++) {
                double p, ds;
                deft_att_probs(a, &t, i, j, &p, &ds);
                for (int64_t c = 0; c < a->d; c++) dq[i][c] += a->scale * ds * t.k[j][c];
            }
    }
    deft_att_store(a, g->dq, &a->l.qkv, bh, q0, t.qn, dq);
}

static void deft_att_dkv_tile(const deft_att *a, const deft_att_grad_in *g, int64_t bh, int64_t k0) {
    deft_att_pair t;
    double dk[DEFT_ATT_TILE][DEFT_ATT_DMAX], dv[DEFT_ATT_TILE][DEFT_ATT_DMAX];
    deft_att_load_keys(a, g, bh, k0, a->t, &t);
    for (int j = 0; j < t.kn; j++)
        for (int64_t c = 0; c < a->d; c++) dk[j][c] = dv[j][c] = 0.0;
    /* Causal: query rows before k0 see none of these keys. */
    for (int64_t q0 = a->causal ? k0 : 0; q0 < a->t; q0 += DEFT_ATT_TILE) {
        deft_att_load_queries(a, g, bh, q0, &t);
        for (int i = 0; i < t.qn; i++)
            for (int j = 0; j < t.kn; j++) {
                double p, ds;
                deft_att_probs(a, &t, i, j, &p, &ds);
                for (int64_t c = 0; c < a->d; c++) {
                    dv[j][c] += p * t.dout[i][c];
                    dk[j][c] += a->scale * ds * t.q[i][c];
                }
            }
    }
    deft_att_store(a, g->dk, &a->l.qkv, bh, k0, t.kn, dk);
    deft_att_store(a, g->dv, &a->l.qkv, bh, k0, t.kn, dv);
}

static deft_status deft_cpu_attention_backward(const deft_tensor *n, void *out, const void *const *in) {
    const deft_att a = deft_att_of(n);
    const int last = n->nsrc - 1;   /* the forward node, whose statistics follow its value */
    const size_t part = (size_t)a.l.part * deft_dtype_size(a.dt);
    const void *qkv[3];
    deft_att_qkv(&a, n, in + 1, qkv);
    const deft_att_grad_in g = {in[0], qkv[0], qkv[1], qkv[2], in[last],
                                (const char *)in[last] + deft_node_extra_offset(n->src[last]), out,
                                (char *)out + part, (char *)out + 2 * part, (char *)out + deft_node_extra_offset(n)};
    const int64_t tiles = deft_att_tiles(&a), work = a.bh * tiles;
    const int par = work > 1 && a.bh * a.t * a.t * a.d >= DEFT_CPU_PAR_MIN;
    DEFT_OMP(parallel for schedule(static) if (par))
    for (int64_t w = 0; w < work; w++) deft_att_delta_tile(&a, &g, w / tiles, (w % tiles) * DEFT_ATT_TILE);
    DEFT_OMP(parallel for schedule(dynamic) if (par))
    for (int64_t w = 0; w < work; w++) deft_att_dq_tile(&a, &g, w / tiles, (w % tiles) * DEFT_ATT_TILE);
    DEFT_OMP(parallel for schedule(dynamic) if (par))
    for (int64_t w = 0; w < work; w++) deft_att_dkv_tile(&a, &g, w / tiles, (w % tiles) * DEFT_ATT_TILE);
    return DEFT_OK;
}

deft_status deft_cpu_attention(const deft_tensor *n, void *out, const void *const *in) {
    if (!deft_cpu_is_float(n->dtype)) return deft_cpu_dtype_error(n, n->dtype);
    const int64_t d = deft_attention_dims_of(n).d;
    if (d > DEFT_ATT_DMAX)
        return deft_set_error(DEFT_ERR_SHAPE, "%s: head size %lld is past the CPU kernel's %d", deft_op_name(n->op),
                              (long long)d, DEFT_ATT_DMAX);
    if (n->op == DEFT_OP_ATTENTION) return deft_cpu_attention_forward(n, out, in);
    return deft_cpu_attention_backward(n, out, in);
}
