/* CPU kernels, matmul: every transpose combination, broadcast batch dims on either side, the folded linear-layer
 * case, awkward sizes, f32/f64/f16/bf16, against a float64 reference. */
#include "ref.h"

static uint64_t rng = 0x5eed0002ull;

typedef struct mm_case {
    int na;
    int64_t abatch[3];
    int nb;
    int64_t bbatch[3];
    int64_t M, K, N;
} mm_case;

static const mm_case cases[] = {
    {0, {0}, 0, {0}, 1, 1, 1},
    {0, {0}, 0, {0}, 7, 33, 5},
    {0, {0}, 0, {0}, 33, 1000, 7},
    {0, {0}, 0, {0}, 1, 7, 1000},
    {0, {0}, 0, {0}, 130, 257, 65},
    {1, {3}, 0, {0}, 7, 5, 4},            /* b 2-D: the batch folds into M */
    {2, {2, 3}, 0, {0}, 33, 7, 1},
    {0, {0}, 1, {3}, 7, 5, 4},            /* a 2-D against batched b */
    {2, {2, 1}, 1, {3}, 7, 5, 4},         /* batch [2,1] x [3] -> [2,3] */
    {3, {1, 4, 1}, 1, {3}, 5, 9, 6},      /* batch [1,4,1] x [3] -> [1,4,3] */
    {1, {5}, 1, {5}, 1, 33, 1},
    {1, {4}, 1, {1}, 9, 8, 7},            /* a size-1 batch dim on b */
};

static void run_case(const mm_case *c, deft_dtype dt, int ta, int tb) {
    int64_t ashape[5], bshape[5];
    for (int i = 0; i < c->na; i++) ashape[i] = c->abatch[i];
    for (int i = 0; i < c->nb; i++) bshape[i] = c->bbatch[i];
    ashape[c->na] = ta ? c->K : c->M, ashape[c->na + 1] = ta ? c->M : c->K;
    bshape[c->nb] = tb ? c->N : c->K, bshape[c->nb + 1] = tb ? c->K : c->N;
    ref_tensor a = ref_random(&rng, dt, c->na + 2, ashape, -1.0, 1.0);
    ref_tensor b = ref_random(&rng, dt, c->nb + 2, bshape, -1.0, 1.0);
    deft_graph *g = deft_graph_new();
    deft_tensor *out = deft_matmul_t(ref_const(g, &a), ref_const(g, &b), ta, tb);

    /* The expected output shape: numpy-broadcast batch dims, then M, N. */
    int nbatch = c->na > c->nb ? c->na : c->nb;
    int64_t oshape[6];
    for (int i = 0; i < nbatch; i++) {
        int ia = c->na - nbatch + i, ib = c->nb - nbatch + i;
        int64_t da = ia >= 0 ? c->abatch[ia] : 1, db = ib >= 0 ? c->bbatch[ib] : 1;
        oshape[i] = da == 1 ? db : da;
    }
    oshape[nbatch] = c->M, oshape[nbatch + 1] = c->N;
    char what[160], sa[64], sb[64];
    snprintf(what, sizeof what, "matmul %s a%s%s b%s%s", deft_dtype_name(dt), ref_shape_str(a.ndim, a.shape, sa, 64),
             ta ? "^T" : "", ref_shape_str(b.ndim, b.shape, sb, 64), tb ? "^T" : "");
    CHECK_MSG(ref_shape_eq(out, nbatch + 2, oshape), "%s: wrong output shape", what);

    double *got = ref_realize(out);
    if (got) {
        const int64_t nout = ref_numel(nbatch + 2, oshape), batch = ref_numel(nbatch, oshape);
        double *want = malloc((size_t)nout * sizeof(double));
        int64_t idx[8];
        for (int64_t t = 0; t < batch; t++) {
            ref_unravel(nbatch, oshape, t, idx);
            const int64_t aoff = ref_bcast_offset(c->na, c->abatch, nbatch, idx) * c->M * c->K;
            const int64_t boff = ref_bcast_offset(c->nb, c->bbatch, nbatch, idx) * c->K * c->N;
            for (int64_t i = 0; i < c->M; i++)
                for (int64_t j = 0; j < c->N; j++) {
                    double acc = 0.0;
                    for (int64_t k = 0; k < c->K; k++) {
                        double x = a.v[aoff + (ta ? k * c->M + i : i * c->K + k)];
                        double y = b.v[boff + (tb ? j * c->K + k : k * c->N + j)];
                        acc += x * y;
                    }
                    want[(t * c->M + i) * c->N + j] = acc;
                }
        }
        /* Rounding the reference to the dtype is left out on purpose: the tolerance covers one final rounding.
         * f16/bf16 products accumulate in f32, so their error is that rounding. */
        ref_close(what, dt, got, want, nout);
        free(want);
        free(got);
    }
    deft_graph_free(g);
    ref_free(&a);
    ref_free(&b);
}

/* A matmul against the identity returns its input exactly (every product is x*1 or x*0). */
static void test_identity(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    for (int di = 0; di < 4; di++) {
        const int64_t as[2] = {33, 17}, is[2] = {17, 17};
        ref_tensor a = ref_random(&rng, dts[di], 2, as, -5, 5), id = ref_alloc(dts[di], 2, is);
        for (int i = 0; i < 17; i++) ref_set(&id, i * 17 + i, 1.0);
        deft_graph *g = deft_graph_new();
        double *got = ref_realize(deft_matmul(ref_const(g, &a), ref_const(g, &id)));
        if (got) ref_close_tol("matmul by identity", got, a.v, a.n, 0.0);
        free(got);
        deft_graph_free(g);
        ref_free(&a), ref_free(&id);
    }
}

int main(void) {
    static const deft_dtype dts[] = REF_FLOAT_DTYPES;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int di = 0; di < 4; di++)
            for (int t = 0; t < 4; t++) run_case(&cases[ci], dts[di], t & 1, t >> 1);
    test_identity();
    printf("cblas: %d\n", deft_has_blas());
    return deft_check_finish();
}
