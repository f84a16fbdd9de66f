/* The conv2d kernels for one element type, included by cpu_conv.c once per type with CONV_T (the type), CONV_SFX
 * (the suffix of the names) and CONV_GEMM (its gemm) defined. Everything goes through im2col: the patches of one
 * image and group become the columns of a [K, P] matrix (K = C/groups * KH * KW, P = OH * OW), in the order the
 * weight stores its K axis, so the product with the weight is one gemm and the layouts differ only in strides. */
#define CONV_CAT_(a, b) a##b
#define CONV_CAT(a, b) CONV_CAT_(a, b)
#define CONV_FN(name) CONV_CAT(name, CONV_SFX)

static void CONV_FN(im2col_)(const conv_geom *g, const CONV_T *x, int64_t gi, CONV_T *col) {
    DEFT_OMP(parallel for schedule(static) if (g->K * g->P > DEFT_CPU_PAR_MIN))
    for (int64_t r = 0; r < g->K; r++) {
        int64_t c, kh, kw;
        conv_decode(g, r, &c, &kh, &kw);
        const CONV_T *xc = x + (gi * g->Cg + c) * g->xsC;
        CONV_T *row = col + r * g->P;
        for (int64_t oh = 0; oh < g->OH; oh++) {
            const int64_t ih = oh * g->sh - g->ph + kh * g->dh;
            CONV_T *out = row + oh * g->OW;
            if (ih < 0 || ih >= g->H) {
                for (int64_t ow = 0; ow < g->OW; ow++) out[ow] = 0;
                continue;
            }
            const CONV_T *xr = xc + ih * g->xsH;
            for (int64_t ow = 0; ow < g->OW; ow++) {
                const int64_t iw = ow * g->sw - g->pw + kw * g->dw;
                out[ow] = (iw >= 0 && iw < g->W) ? xr[iw * g->xsW] : (CONV_T)0;
            }
        }
    }
}

/* Adds the columns back onto the image they came from; one thread per channel, so no two write the same element. */
static void CONV_FN(col2im_)(const conv_geom *g, const CONV_T *col, int64_t gi, CONV_T *dx) {
    DEFT_OMP(parallel for schedule(static) if (g->K * g->P > DEFT_CPU_PAR_MIN))
    for (int64_t c = 0; c < g->Cg; c++) {
        CONV_T *xc = dx + (gi * g->Cg + c) * g->xsC;
        for (int64_t kh = 0; kh < g->KH; kh++) {
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const CONV_T *row = col + conv_row(g, c, kh, kw) * g->P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    const int64_t ih = oh * g->sh - g->ph + kh * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    for (int64_t ow = 0; ow < g->OW; ow++) {
                        const int64_t iw = ow * g->sw - g->pw + kw * g->dw;
                        if (iw >= 0 && iw < g->W) xc[ih * g->xsH + iw * g->xsW] += row[oh * g->OW + ow];
                    }
                }
            }
        }
    }
}

static void CONV_FN(add_bias_)(const conv_geom *g, const CONV_T *b, CONV_T *y) {
    const int64_t rows = g->N * (g->nhwc ? g->P : g->O);
    DEFT_OMP(parallel for schedule(static) if (rows * (g->nhwc ? g->O : g->P) > DEFT_CPU_PAR_MIN))
    for (int64_t i = 0; i < rows; i++) {
        if (g->nhwc) {
            for (int64_t o = 0; o < g->O; o++) y[i * g->O + o] += b[o];
        } else {
            const CONV_T v = b[i % g->O];
            for (int64_t p = 0; p < g->P; p++) y[i * g->P + p] += v;
        }
    }
}

/* y (n, group) = W_g [Og, K] x col [K, P]; NHWC writes its transpose, rows of P with a stride of O. */
static void CONV_FN(conv_forward_)(const conv_geom *g, const CONV_T *x, const CONV_T *w, const CONV_T *b, CONV_T *y,
                                   CONV_T *col) {
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t gi = 0; gi < g->G; gi++) {
            CONV_FN(im2col_)(g, x + n * g->xsN, gi, col);
            const CONV_T *wg = w + gi * g->Og * g->K;
            if (!g->nhwc)
                CONV_GEMM(0, 0, g->Og, g->P, g->K, wg, g->K, col, g->P, 0, y + (n * g->O + gi * g->Og) * g->P, g->P);
            else
                CONV_GEMM(1, 1, g->P, g->Og, g->K, col, g->P, wg, g->K, 0, y + n * g->P * g->O + gi * g->Og, g->O);
        }
    }
    if (b) CONV_FN(add_bias_)(g, b, y);
}

/* dcol [K, P] = W_g^T x dy_g, then col2im into dx. */
static void CONV_FN(conv_input_grad_)(const conv_geom *g, const CONV_T *dy, const CONV_T *w, CONV_T *dx,
                                      CONV_T *col) {
    memset(dx, 0, (size_t)(g->N * g->xsN) * sizeof(CONV_T));
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t gi = 0; gi < g->G; gi++) {
            const CONV_T *wg = w + gi * g->Og * g->K;
            if (!g->nhwc)
                CONV_GEMM(1, 0, g->K, g->P, g->Og, wg, g->K, dy + (n * g->O + gi * g->Og) * g->P, g->P, 0, col, g->P);
            else
                CONV_GEMM(1, 1, g->K, g->P, g->Og, wg, g->K, dy + n * g->P * g->O + gi * g->Og, g->O, 0, col, g->P);
            CONV_FN(col2im_)(g, col, gi, dx + n * g->xsN);
        }
    }
}

/* dW_g [Og, K] += dy_g [Og, P] x col^T, over the batch. */
static void CONV_FN(conv_weight_grad_)(const conv_geom *g, const CONV_T *dy, const CONV_T *x, CONV_T *dw,
                                       CONV_T *col) {
    memset(dw, 0, (size_t)(g->O * g->K) * sizeof(CONV_T));
    for (int64_t n = 0; n < g->N; n++) {
        for (int64_t gi = 0; gi < g->G; gi++) {
            CONV_FN(im2col_)(g, x + n * g->xsN, gi, col);
            CONV_T *dwg = dw + gi * g->Og * g->K;
            if (!g->nhwc)
                CONV_GEMM(0, 1, g->Og, g->K, g->P, dy + (n * g->O + gi * g->Og) * g->P, g->P, col, g->P, 1, dwg, g->K);
            else
                CONV_GEMM(1, 1, g->Og, g->K, g->P, dy + n * g->P * g->O + gi * g->Og, g->O, col, g->P, 1, dwg, g->K);
        }
    }
}

static deft_status CONV_FN(conv_run_)(const deft_tensor *n, const conv_geom *g, void *out, const void *const *in) {
    /* K and P each fit (the weight and the output are nodes) but their product need not: huge padding can make it. */
    size_t bytes;
    if (!deft_shape_bytes(2, (const int64_t[]){g->K, g->P}, sizeof(CONV_T), &bytes))
        return deft_set_error(DEFT_ERR_SHAPE, "%s: the im2col scratch of %lld x %lld elements is too large",
                              deft_op_name(n->op), (long long)g->K, (long long)g->P);
    CONV_T *col = malloc(bytes);
    if (!col)
        return deft_set_error(DEFT_ERR_OOM, "%s: no host memory for %zu bytes of im2col scratch", deft_op_name(n->op),
                              bytes);
    switch (n->op) {
    case DEFT_OP_CONV2D: CONV_FN(conv_forward_)(g, in[0], in[1], n->nsrc > 2 ? in[2] : NULL, out, col); break;
    case DEFT_OP_CONV2D_INPUT_GRAD: CONV_FN(conv_input_grad_)(g, in[0], in[1], out, col); break;
    default: CONV_FN(conv_weight_grad_)(g, in[0], in[1], out, col); break;
    }
    free(col);
    return DEFT_OK;
}

#undef CONV_FN
#undef CONV_CAT
#undef CONV_CAT_
