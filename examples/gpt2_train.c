/* GPT-2 trained from token shards (llm.c's format) or a text file: the model of examples/gpt2.h, AdamW with weight
 * decay on the 2-D weights only, warmup and a cosine learning rate, gradient clipping, bf16 autocast on a GPU, an
 * optional activation checkpointing budget; progress (loss, tokens/s, memory), validation loss, and a short sample
 * from the model at the end. Without --tokens it trains a small character-level model on a licence text every
 * Debian system has.
 *
 * Under a launcher (scripts/deft_launch, torchrun, mpirun: RANK and WORLD_SIZE or their MPI kin set) each process
 * trains one replica of a data-parallel world on its GPU (deft_dist_options_from_env, deft_dist_init; the compile
 * options dist and dist_local 0, zero_stage 1 with --zero), its own batches of one global order (the token feed's
 * rank and world); rank 0 alone prints, validates and samples, and every rank saves and resumes its own state file
 * (<FILE>.rank<R>).
 *
 *   ./gpt2_train [--model 124M | --layers L --width C --heads H --seq T --vocab V] [--tokens PATTERN | --text FILE]
 *                [--steps N] [--batch B] [--lr LR] ...   (--help lists every option)
 *   scripts/deft_launch -n 2 ./gpt2_train --model 124M --tokens data --batch 16 [--zero] */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deft.h"
#include "example_util.h"
#include "gpt2.h"

#define DEFAULT_TEXT "/usr/share/common-licenses/GPL-3"

typedef struct options {
    gpt2_config model;
    const char *tokens, *val_tokens, *text, *device, *trace, *init_out, *state, *resume;
    int64_t batch, steps, warmup, val_every, val_batches, log_every, sample, save_every, loss_chunks;
    double lr, min_lr_frac, weight_decay, clip;
    size_t checkpoint_budget;
    deft_dtype autocast;
    int autocast_set, no_shuffle, print_plan, deterministic, zero, reorder, matmul_find, param_copies, reduce_bf16;
    int nccl_blocks;   /* 0: the dist's default; -1: --nccl-blocks was not a whole number in 1..64 */
    double dist_timeout;
    uint64_t seed;
} options;

static const char help[] =
    "usage: gpt2_train [options]\n"
    "\n"
    "Trains GPT-2 (learned positions, pre-norm blocks, causal self-attention, GELU (tanh), tied LM head) with AdamW\n"
    "(weight decay on 2-D weights only), warmup + cosine learning rate and gradient clipping, printing the loss,\n"
    "tokens/s and memory, the validation loss, and a sample from the model at the end.\n"
    "\n"
    "Model (default: a small character-level model, 4 layers, width 128, 4 heads, seq 128, vocab 256):\n"
    "  --model 124M         GPT-2 small: 12 layers, width 768, 12 heads, seq 1024, vocab 50304\n"
    "  --layers L           blocks (default: 4)\n"
    "  --width C            model width (default: 128)\n"
    "  --heads H            attention heads; must divide the width (default: 4)\n"
    "  --seq T              sequence length (default: 128)\n"
    "  --vocab V            vocabulary size (default: 256; token ids must be below it)\n"
    "Data:\n"
    "  --tokens PATTERN     training shards in llm.c's format: a file, a directory or a glob (with a directory,\n"
    "                       its *_train_*.bin shards train and its *_val_*.bin shards validate)\n"
    "  --val-tokens PATTERN validation shards (default: from --tokens' directory, or the text's last tenth)\n"
    "  --text FILE          train on FILE's bytes as tokens (vocab 256; default: " DEFAULT_TEXT ")\n"
    "Training:\n"
    "  --steps N            optimizer steps (default: 200)\n"
    "  --batch B            sequences per step (default: 8)\n"
    "  --lr LR              peak learning rate (default: 1e-3)\n"
    "  --min-lr-frac F      the cosine ends at F * LR (default: 0.1)\n"
    "  --warmup W           linear warmup steps (default: steps / 10)\n"
    "  --weight-decay WD    AdamW's decay of the 2-D weights (default: 0.1)\n"
    "  --clip NORM          clip gradients to this global norm; 0: no clipping (default: 1.0)\n"
    "  --autocast bf16|f16|none   mixed precision (default: bf16 on a GPU, none on the CPU)\n"
    "  --checkpoint-budget BYTES  activation checkpointing to fit this many bytes a step (default: none)\n"
    "  --loss-chunks K      the loss over K blocks of rows, each block's logits their own product (K divides\n"
    "                       batch x seq; default: 1, the whole logits)\n"
    "  --reorder            the compile option reorder: with --loss-chunks each block's logits are freed right after\n"
    "                       its gradient, instead of all of them living into the backward pass (default: off)\n"
    "  --matmul-find        the compile option matmul_find: on a GPU the training step's products time cuBLASLt's\n"
    "                       candidate algorithms once per shape and keep the fastest (default: the heuristic's\n"
    "                       first); not with --state or --resume, whose runs must repeat their bits\n"
    "  --param-copies       the compile option param_copies: the training step reads the optimizer's bf16 (f16)\n"
    "                       copies of the weights, written by each update, instead of casting them (default: off;\n"
    "                       with --zero the step all-gathers the copies instead of the f32 weights)\n"
    "  --reduce-bf16        under the launcher, the compile option dist_reduce_dtype = bf16: the weights' bf16\n"
    "                       gradients averaged as they are (default: f32; not with --zero)\n"
    "  --device DEV         cpu or cuda:N (default: cuda:0 if a GPU works, else cpu)\n"
    "  --seed S             weights and data order (default: 1337)\n"
    "  --no-shuffle         batches in stream order (windows of seq + 1 tokens every seq tokens), not shuffled\n"
    "  --init-out FILE      write the initial weights (f32, [in, out] linear weights) for a peer to start from\n"
    "                       (bench/peers/gpt2_train.py reads it)\n"
    "  --print-plan         print the training step's memory plan (every buffer, its size and offset)\n"
    "  --state FILE         save the training state (weights, AdamW's moments, counters, the loader's place) to\n"
    "                       FILE at the end\n"
    "  --save-every N       also save it every N steps, to FILE.step<N> (default: 0, only at the end)\n"
    "  --resume FILE        start from a saved state: the run continues as if it had never stopped, bit for bit\n"
    "                       (the same model, data and options; --steps counts from the start of training)\n"
    "  --deterministic      the same bits every run (on a GPU, attention's backward without float atomics; on by\n"
    "                       default with --state or --resume)\n"
    "Reports:\n"
    "  --log-every N        print the loss every N steps (default: 10)\n"
    "  --val-every N        validation loss every N steps and at the end; 0: only at the end (default: 100)\n"
    "  --val-batches K      validation batches (default: 8)\n"
    "  --sample N           tokens to generate at the end (greedy); 0: none (default: 200)\n"
    "  --trace FILE         after training, trace one more step to a Chrome trace-event JSON file\n"
    "Several GPUs, one process each (under scripts/deft_launch -n N, torchrun or mpirun, which set RANK and\n"
    "WORLD_SIZE; without them it trains alone, as above):\n"
    "                       each rank trains a replica on its GPU (cuda:LOCAL_RANK), gradients averaged over NCCL;\n"
    "                       --batch is per rank, each rank takes its own batches of one global order; rank 0\n"
    "                       alone prints, validates and samples; --state, --save-every, --resume and --trace files\n"
    "                       get .rank<R> appended: one per rank\n"
    "  --zero               ZeRO-1: the optimizer's state sharded over the ranks (compile option zero_stage 1)\n"
    "  --dist-timeout S     seconds any wait on another rank may take before the run fails (default: 120)\n"
    "  --nccl-blocks K      NCCL's blocks per collective, 1 to 64 (the dist option collective_blocks; default: 32)\n"
    "  -h, --help           this help\n";

static int parse_size(const char *s, size_t *out) {
    char *end = NULL;
    const double v = strtod(s, &end);
    if (end == s || v < 0 || !isfinite(v)) return 0;
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mult = 1073741824.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (v * mult >= 18446744073709551616.0) return 0;   /* 2^64: past any size_t (converting it is undefined) */
    *out = (size_t)(v * mult);
    return *end == 0;
}

static int parse_one(options *o, const char *k, const char *v) {
    if (!strcmp(k, "--model")) {
        if (strcmp(v, "124M") && strcmp(v, "124m")) return 0;
        o->model = gpt2_124m();
    } else if (!strcmp(k, "--layers")) o->model.layers = atoll(v);
    else if (!strcmp(k, "--width")) o->model.width = atoll(v);
    else if (!strcmp(k, "--heads")) o->model.heads = atoll(v);
    else if (!strcmp(k, "--seq")) o->model.seq = atoll(v);
    else if (!strcmp(k, "--vocab")) o->model.vocab = atoll(v);
    else if (!strcmp(k, "--tokens")) o->tokens = v;
    else if (!strcmp(k, "--val-tokens")) o->val_tokens = v;
    else if (!strcmp(k, "--text")) o->text = v;
    else if (!strcmp(k, "--steps")) o->steps = atoll(v);
    else if (!strcmp(k, "--batch")) o->batch = atoll(v);
    else if (!strcmp(k, "--lr")) o->lr = atof(v);
    else if (!strcmp(k, "--min-lr-frac")) o->min_lr_frac = atof(v);
    else if (!strcmp(k, "--warmup")) o->warmup = atoll(v);
    else if (!strcmp(k, "--weight-decay")) o->weight_decay = atof(v);
    else if (!strcmp(k, "--clip")) o->clip = atof(v);
    else if (!strcmp(k, "--autocast")) {
        o->autocast_set = 1;
        if (!strcmp(v, "bf16")) o->autocast = DEFT_BF16;
        else if (!strcmp(v, "f16")) o->autocast = DEFT_F16;
        else if (!strcmp(v, "none")) o->autocast = DEFT_F32;
        else return 0;
    } else if (!strcmp(k, "--checkpoint-budget")) return parse_size(v, &o->checkpoint_budget);
    else if (!strcmp(k, "--device")) o->device = v;
    else if (!strcmp(k, "--seed")) o->seed = (uint64_t)atoll(v);
    else if (!strcmp(k, "--log-every")) o->log_every = atoll(v);
    else if (!strcmp(k, "--val-every")) o->val_every = atoll(v);
    else if (!strcmp(k, "--val-batches")) o->val_batches = atoll(v);
    else if (!strcmp(k, "--sample")) o->sample = atoll(v);
    else if (!strcmp(k, "--init-out")) o->init_out = v;
    else if (!strcmp(k, "--state")) o->state = v;
    else if (!strcmp(k, "--save-every")) o->save_every = atoll(v);
    else if (!strcmp(k, "--resume")) o->resume = v;
    else if (!strcmp(k, "--dist-timeout")) o->dist_timeout = atof(v);
    else if (!strcmp(k, "--nccl-blocks")) {
        char *end = NULL;
        const long b = strtol(v, &end, 10);
        o->nccl_blocks = end != v && !*end && b >= 1 && b <= DEFT_DIST_MAX_BLOCKS ? (int)b : -1;
    }
    else if (!strcmp(k, "--loss-chunks")) o->loss_chunks = atoll(v);
    else return 0;
    return 1;
}

/* Flags without a value. */
static int parse_flag(options *o, const char *k) {
    if (!strcmp(k, "--no-shuffle")) o->no_shuffle = 1;
    else if (!strcmp(k, "--print-plan")) o->print_plan = 1;
    else if (!strcmp(k, "--deterministic")) o->deterministic = 1;
    else if (!strcmp(k, "--zero")) o->zero = 1;
    else if (!strcmp(k, "--reorder")) o->reorder = 1;
    else if (!strcmp(k, "--matmul-find")) o->matmul_find = 1;
    else if (!strcmp(k, "--param-copies")) o->param_copies = 1;
    else if (!strcmp(k, "--reduce-bf16")) o->reduce_bf16 = 1;
    else return 0;
    return 1;
}

/* The model's sizes, each with a message that names it: the library would refuse them too, but as the shape of
 * whichever op first fails, not as the option that caused it. */
static int model_ok(const gpt2_config *c) {
    const char *why = c->layers < 1 || c->layers > 64 ? "--layers must be in [1, 64]"
                      : c->width < 1 || c->heads < 1 ? "--width and --heads must be positive"
                      : c->width % c->heads ? "--heads must divide --width"
                      : c->width / c->heads > DEFT_ATTENTION_MAX_HEAD ? "--width / --heads is above the head limit, 128"
                      : c->seq < 1 || c->vocab < 2 ? "--seq must be positive and --vocab at least 2"
                      : NULL;
    if (why) fprintf(stderr, "gpt2_train: %s (layers %lld, width %lld, heads %lld, seq %lld, vocab %lld)\n", why,
                     (long long)c->layers, (long long)c->width, (long long)c->heads, (long long)c->seq,
                     (long long)c->vocab);
    return why == NULL;
}

/* What is wrong with the options once parsed, or NULL: the first of the rules the help states. */
static const char *options_problem(const options *o) {
    if (o->steps <= 0 || o->batch <= 0 || o->log_every <= 0 || o->val_batches <= 0)
        return "--steps, --batch, --log-every and --val-batches must be at least 1";
    if (o->lr <= 0) return "--lr must be positive";
    if (o->val_every < 0 || o->sample < 0 || o->save_every < 0)
        return "--val-every, --sample and --save-every cannot be negative";
    if (o->save_every && !o->state) return "--save-every needs --state FILE";
    if (o->tokens && o->text) return "give --tokens or --text, not both";
    if (o->dist_timeout <= 0) return "--dist-timeout must be positive";
    if (o->nccl_blocks < 0) return "--nccl-blocks takes a whole number of blocks, 1 to 64";
    /* a timed choice may differ from one process to the next, and with it the products' rounding */
    if (o->matmul_find && (o->state || o->resume)) return "--matmul-find is not for runs saved or resumed";
    if (o->reduce_bf16 && o->zero) return "--reduce-bf16 does not work with --zero yet";
    return NULL;
}

/* 1 when the options are usable; otherwise 0, with what is wrong said on stderr. */
static int parse(int argc, char **argv, options *o) {
    *o = (options){.model = {256, 128, 128, 4, 4}, .batch = 8, .steps = 200, .warmup = -1, .val_every = 100,
                   .val_batches = 8, .log_every = 10, .sample = 200, .lr = 1e-3, .min_lr_frac = 0.1,
                   .weight_decay = 0.1, .clip = 1.0, .seed = 1337, .dist_timeout = 120};
    int bad = 0;
    o->trace = example_trace_arg(&argc, argv, &bad);
    if (bad) fprintf(stderr, "gpt2_train: --trace needs a file\n");
    for (int i = 1; !bad && i < argc; i++) {
        if (parse_flag(o, argv[i])) continue;
        bad = i + 1 >= argc || !parse_one(o, argv[i], argv[i + 1]);
        if (bad && i + 1 >= argc)
            fprintf(stderr, "gpt2_train: %s: an unknown flag, or an option without its value\n", argv[i]);
        else if (bad)
            fprintf(stderr, "gpt2_train: %s %s: an unknown option or a value it does not take\n", argv[i], argv[i + 1]);
        i++;
    }
    if (o->warmup < 0) o->warmup = o->steps / 10;
    if (!bad && (o->loss_chunks < 0 || (o->loss_chunks > 1 && o->batch > 0 && o->model.seq > 0 &&
                                        (o->batch > INT64_MAX / o->model.seq ||
                                         (o->batch * o->model.seq) % o->loss_chunks != 0)))) {
        fprintf(stderr, "gpt2_train: --loss-chunks %lld must be at least 1 and divide batch x seq (%lld x %lld)\n",
                (long long)o->loss_chunks, (long long)o->batch, (long long)o->model.seq);
        return 0;
    }
    const char *problem = bad ? NULL : options_problem(o);
    if (problem) fprintf(stderr, "gpt2_train: %s\n", problem);
    return !bad && !problem && model_ok(&o->model);
}

/* ---- data: shards, or a text file written into shards (bytes as tokens) in a temporary directory ---- */

typedef struct data {
    deft_tokens *train, *val;
    char dir[256];             /* the text's shards, removed at the end */
    char why[512];             /* a failure the library did not describe (reading the text) */
} data;

/* The text's bytes as tokens, or NULL with d->why saying what went wrong. */
static int32_t *read_text(data *d, const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    unsigned char *bytes = len > 0 ? malloc((size_t)len) : NULL;
    int32_t *tok = len > 0 && (unsigned long)len <= SIZE_MAX / sizeof(int32_t) ? malloc(sizeof(int32_t) * (size_t)len)
                                                                                : NULL;
    const int ok = f && bytes && tok && fseek(f, 0, SEEK_SET) == 0 && fread(bytes, 1, (size_t)len, f) == (size_t)len;
    if (!f) snprintf(d->why, sizeof d->why, "cannot open the text %s: %s", path, strerror(errno));
    else if (len == 0) snprintf(d->why, sizeof d->why, "the text %s is empty", path);
    else if (!ok) snprintf(d->why, sizeof d->why, "cannot read the text %s", path);
    if (f) fclose(f);
    for (long i = 0; ok && i < len; i++) tok[i] = bytes[i];
    free(bytes);
    if (!ok) free(tok);
    *n = ok ? (int64_t)len : 0;
    return ok ? tok : NULL;
}

/* The last tenth validates. The shards go to a fresh temporary directory, removed by data_close. */
static deft_status text_to_shards(data *d, const char *path) {
    int64_t n = 0;
    int32_t *tok = read_text(d, path, &n);
    if (!tok) return DEFT_ERR_IO;
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[sizeof d->dir];
    deft_status s = DEFT_OK;
    if (snprintf(dir, sizeof dir, "%s/deft-gpt2-XXXXXX", tmp) >= (int)sizeof dir || !mkdtemp(dir)) {
        snprintf(d->why, sizeof d->why, "cannot make a temporary directory in %s for the text's shards", tmp);
        s = DEFT_ERR_IO;
    } else {
        memcpy(d->dir, dir, sizeof dir);
    }
    char train[sizeof d->dir + 32], val[sizeof d->dir + 32];
    snprintf(train, sizeof train, "%s/text_train.bin", d->dir);
    snprintf(val, sizeof val, "%s/text_val.bin", d->dir);
    const int64_t n_val = n / 10;
    if (s == DEFT_OK) s = deft_tokens_write(val, tok + (n - n_val), n_val);
    if (s == DEFT_OK) s = deft_tokens_write(train, tok, n - n_val);
    if (s == DEFT_OK) s = deft_tokens_open(train, &d->train);
    if (s == DEFT_OK) s = deft_tokens_open(val, &d->val);
    free(tok);
    return s;
}

static deft_status data_open(data *d, const options *o) {
    memset(d, 0, sizeof *d);
    if (!o->tokens) return text_to_shards(d, o->text ? o->text : DEFAULT_TEXT);
    char train[1024], val[1024];
    snprintf(train, sizeof train, "%s", o->tokens);
    snprintf(val, sizeof val, "%s", o->val_tokens ? o->val_tokens : "");
    deft_tokens *probe = NULL;
    /* A directory: its *_train_* shards train, its *_val_* shards validate, as llm.c's data scripts name them. */
    if (!o->val_tokens && deft_tokens_open(o->tokens, &probe) == DEFT_OK) {
        int has_val = 0;
        for (int i = 0; i < deft_tokens_shards(probe); i++)
            has_val |= strstr(deft_tokens_shard_path(probe, i), "_val_") != NULL;
        if (has_val) {
            snprintf(train, sizeof train, "%s/*_train_*.bin", o->tokens);
            snprintf(val, sizeof val, "%s/*_val_*.bin", o->tokens);
        }
        deft_tokens_close(probe);
    }
    deft_status s = deft_tokens_open(train, &d->train);
    if (s == DEFT_OK && val[0]) s = deft_tokens_open(val, &d->val);
    return s;
}

static void data_close(data *d) {
    deft_tokens_close(d->train);
    deft_tokens_close(d->val);
    if (d->dir[0]) {
        char p[300];
        snprintf(p, sizeof p, "%s/text_train.bin", d->dir);
        remove(p);
        snprintf(p, sizeof p, "%s/text_val.bin", d->dir);
        remove(p);
        remove(d->dir);
    }
}

/* ---- the initial weights for a peer: b"DEFTREF1", a count, then per parameter its name, dtype 0 (f32), dims and
 * values (tests/reference/gpt2_reference.py's format) ---- */

static int write_entry(FILE *f, const char *name, deft_tensor *p) {
    const int32_t len = (int32_t)strlen(name), dt = 0, nd = deft_tensor_ndim(p);
    const int64_t n = deft_tensor_numel(p);
    float *v = malloc(sizeof(float) * (size_t)n);
    int ok = v && deft_param_get(p, v, sizeof(float) * (size_t)n) == DEFT_OK;
    ok = ok && fwrite(&len, 4, 1, f) == 1 && fwrite(name, 1, (size_t)len, f) == (size_t)len &&
         fwrite(&dt, 4, 1, f) == 1 && fwrite(&nd, 4, 1, f) == 1;
    for (int d = 0; ok && d < nd; d++) {
        const int64_t dim = deft_tensor_dim(p, d);
        ok = fwrite(&dim, 8, 1, f) == 1;
    }
    ok = ok && fwrite(v, sizeof(float), (size_t)n, f) == (size_t)n;
    free(v);
    return ok;
}

static deft_status write_init(const deft_optimizer *opt, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return DEFT_ERR_IO;
    const int32_t n = deft_optimizer_param_count(opt);
    int ok = fwrite("DEFTREF1", 1, 8, f) == 8 && fwrite(&n, 4, 1, f) == 1;
    for (int i = 0; ok && i < n; i++) {
        deft_tensor *p = deft_optimizer_param(opt, i);
        char name[128];
        snprintf(name, sizeof name, "param/%s", deft_tensor_name(p));
        ok = write_entry(f, name, p);
    }
    ok = fclose(f) == 0 && ok;
    return ok ? DEFT_OK : DEFT_ERR_IO;
}

/* ---- training ---- */

typedef struct run {
    options o;
    deft_device dev;
    gpt2 m;
    deft_optimizer *opt;
    deft_tensor *step;
    deft_program *train, *eval;
    data d;
    deft_tokens_feed *feed;
    deft_loader *loader;
    deft_dist *dist;           /* under a launcher: this rank's communicator; NULL alone */
    int rank, world;           /* 0 and 1 alone */
} run;

/* Rank 0 prints, validates and samples; alone, this process is rank 0. */
static int lead(const run *r) { return r->rank == 0; }

/* A file of this rank: `base` itself alone, base.rank<R> under a launcher (every rank saves its own state). */
static int rank_path(const run *r, char *out, size_t n, const char *base) {
    const int w = r->dist ? snprintf(out, n, "%s.rank%d", base, r->rank) : snprintf(out, n, "%s", base);
    if (w < 0 || (size_t)w >= n) {
        fprintf(stderr, "gpt2_train: the path %s is too long\n", base);
        return 0;
    }
    return 1;
}

static double lr_at(const options *o, int64_t step) {
    if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
    const double span = (double)(o->steps - o->warmup);
    const double t = span > 0 ? (double)(step - o->warmup) / span : 1.0;
    const double min_lr = o->lr * o->min_lr_frac;
    return min_lr + 0.5 * (o->lr - min_lr) * (1.0 + cos(3.14159265358979323846 * (t < 1 ? t : 1)));
}

static deft_status build(run *r) {
    deft_graph *g = deft_graph_new();
    if (!g) return DEFT_ERR_OOM;
    deft_graph_set_seed(g, r->o.seed);
    const gpt2_build_options bo = {.loss_chunks = r->o.loss_chunks};
    deft_status s = gpt2_build_with(&r->m, g, &r->o.model, r->o.batch, r->dev, &bo);
    if (s == DEFT_OK) s = deft_backward(r->m.loss);
    if (s != DEFT_OK) return s;
    const deft_adamw_options ao = {.lr = r->o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                   .weight_decay = r->o.weight_decay};
    const deft_step_options so = {.max_grad_norm = r->o.clip};
    r->opt = deft_adamw(r->m.g, &ao, &so);
    if (!r->opt) return deft_graph_error(r->m.g);
    s = deft_optimizer_decay_2d_only(r->opt);
    r->step = s == DEFT_OK ? deft_optimizer_step(r->opt) : NULL;
    if (!r->step) return s != DEFT_OK ? s : deft_graph_error(r->m.g);
    /* A saved run resumes bit for bit only if every step gives the same bits: no float atomics anywhere. */
    const int deterministic = r->o.deterministic || r->o.state || r->o.resume;
    /* Under a launcher the step is a replica of the world: gradients averaged (or with --zero reduced to their slices'
     * owners and the state sharded) over NCCL, rank 0's parameters broadcast at its first run. */
    const deft_compile_options co = {.autocast = r->o.autocast, .memory_budget = r->o.checkpoint_budget,
                                     .checkpoint = r->o.checkpoint_budget ? DEFT_CHECKPOINT_BUDGET : 0,
                                     .deterministic = deterministic, .dist = r->dist, .dist_local = 0,
                                     .zero_stage = r->o.zero, .reorder = r->o.reorder,
                                     .matmul_find = r->o.matmul_find, .param_copies = r->o.param_copies,
                                     .dist_reduce_dtype = r->o.reduce_bf16 ? DEFT_BF16 : DEFT_F32};
    r->train = deft_compile(r->m.g, (deft_tensor *[]){r->m.loss, r->step}, 2, &co);
    if (!r->train) return deft_graph_error(r->m.g) != DEFT_OK ? deft_graph_error(r->m.g) : DEFT_ERR_INVALID;
    /* Only rank 0 validates and samples: the others keep no evaluation program (its logits are the largest buffer). */
    /* With --param-copies it reads the copies too: under --zero most f32 weights are current on their owner only. */
    const deft_compile_options eo = {.autocast = r->o.autocast, .param_copies = r->o.param_copies};
    r->eval = lead(r) ? deft_compile(r->m.g, (deft_tensor *[]){r->m.loss, r->m.logits}, 2, &eo) : NULL;
    if (lead(r) && !r->eval) return DEFT_ERR_INVALID;
    /* One order of windows for every rank (the same seed), rank r taking windows r, r + world, ... of it. */
    const deft_tokens_options to = {.shuffle = !r->o.no_shuffle, .seed = r->o.seed, .rank = r->rank,
                                    .world = r->world};
    s = deft_tokens_feed_new(r->d.train, r->o.batch, r->o.model.seq, &to, &r->feed);
    if (s == DEFT_OK) s = deft_loader_new_tokens(r->feed, r->m.x, r->m.y, 0, &r->loader);
    return s;
}

/* The mean loss of the first K validation batches (in stream order). */
static deft_status validate(run *r, double *loss) {
    const int64_t per = r->o.batch * r->o.model.seq;   /* x's elements: the library checked the product */
    int32_t *x = malloc(sizeof(int32_t) * (size_t)(per + 1)), *y = malloc(sizeof(int32_t) * (size_t)per);
    deft_status s = x && y ? DEFT_OK : DEFT_ERR_OOM;
    const int64_t avail = r->d.val ? (deft_tokens_count(r->d.val) - 1) / per : 0;
    const int64_t k = avail < r->o.val_batches ? avail : r->o.val_batches;
    double sum = 0;
    for (int64_t b = 0; s == DEFT_OK && b < k; b++) {
        for (int64_t row = 0; s == DEFT_OK && row < r->o.batch; row++) {
            const int64_t start = b * per + row * r->o.model.seq, t = r->o.model.seq;
            s = deft_tokens_read(r->d.val, start, t + 1, x + row * t);
            if (s == DEFT_OK) memcpy(y + row * t, x + row * t + 1, sizeof(int32_t) * (size_t)t);
        }
        float l = 0;
        if (s == DEFT_OK) s = deft_program_feed(r->eval, r->m.x, x, sizeof(int32_t) * (size_t)per);
        if (s == DEFT_OK) s = deft_program_feed(r->eval, r->m.y, y, sizeof(int32_t) * (size_t)per);
        if (s == DEFT_OK) s = deft_program_run(r->eval);
        if (s == DEFT_OK) s = deft_program_read(r->eval, r->m.loss, &l, sizeof l);
        sum += l;
    }
    *loss = k ? sum / (double)k : NAN;
    free(x);
    free(y);
    return s;
}

static void print_memory(const run *r) {
    deft_memory_report mr;
    if (deft_program_memory(r->train, &mr) == DEFT_OK)
        printf("memory: arena %.1f MiB (lower bound %.1f MiB), parameters and state %.1f MiB\n",
               (double)mr.arena_bytes / 1048576.0, (double)mr.lower_bound_bytes / 1048576.0,
               (double)mr.persistent_bytes / 1048576.0);
}

/* The end's state goes to --state itself, the ones on the way to <state>.step<N>, as llm.c keeps one per save; under
 * a launcher each rank writes its own, <state>[.step<N>].rank<R> (its loader's place is its own, and under ZeRO-1
 * its shard of the optimizer's state). */
static deft_status save_state(run *r, int64_t steps_done, int final) {
    char base[1100], path[1200];
    if (snprintf(base, sizeof base, final ? "%s" : "%s.step%lld", r->o.state, (long long)steps_done) >=
            (int)sizeof base ||
        !rank_path(r, path, sizeof path, base)) {
        fprintf(stderr, "gpt2_train: the state path %s is too long\n", r->o.state);
        return DEFT_ERR_INVALID;
    }
    /* --zero --param-copies leaves most f32 weights current on their owner only: every rank gathers them first. */
    const int partial = r->dist && r->o.zero && r->o.param_copies;
    deft_status s = partial ? deft_dist_gather_params(r->dist, &r->train, 1) : DEFT_OK;
    if (s == DEFT_OK) s = deft_train_state_save(path, r->train, r->opt, r->loader);
    if (s == DEFT_OK && lead(r))
        printf("step %lld  training state saved to %s%s\n", (long long)steps_done, path,
               r->world > 1 ? " (and by each rank to its own .rank<R>)" : "");
    return s;
}

/* Steps [first, steps): first is 0, or the saved run's count when resuming. */
static deft_status train(run *r, int64_t first) {
    /* The global batch: every rank trains on its own batch a step. */
    const double tokens_per_step = (double)(r->o.batch * r->o.model.seq) * (double)r->world;
    double t0 = seconds();
    int64_t logged = first;   /* steps done at the last progress line */
    deft_status s = DEFT_OK;
    for (int64_t step = first; s == DEFT_OK && step < r->o.steps; step++) {
        s = deft_optimizer_set_lr(r->opt, lr_at(&r->o, step));
        if (s == DEFT_OK) s = deft_loader_next(r->loader, r->train, NULL);
        if (s == DEFT_OK) s = deft_program_run(r->train);
        /* Reading the loss waits for the step: only the progress lines do, on rank 0 (its own batch's loss). */
        if (s == DEFT_OK && lead(r) && ((step + 1) % r->o.log_every == 0 || step + 1 == r->o.steps)) {
            float l = 0;
            s = deft_program_read(r->train, r->m.loss, &l, sizeof l);
            const double rate = tokens_per_step * (double)(step + 1 - logged) / (seconds() - t0);
            printf("step %lld/%lld  loss %.4f  lr %.3g  %.0f tokens/s\n", (long long)(step + 1),
                   (long long)r->o.steps, l, lr_at(&r->o, step), rate);
            fflush(stdout);
            logged = step + 1;
            t0 = seconds();
        }
        /* Rank 0's validation runs no collective; the others go on and wait for it in the next step's all-reduce. */
        if (s == DEFT_OK && lead(r) && r->o.val_every && (step + 1) % r->o.val_every == 0 && step + 1 != r->o.steps) {
            double vl = 0;
            s = validate(r, &vl);
            if (s == DEFT_OK && !isnan(vl)) printf("step %lld  validation loss %.4f\n", (long long)(step + 1), vl);
            t0 = seconds();
        }
        if (s == DEFT_OK && r->o.save_every && (step + 1) % r->o.save_every == 0 && step + 1 != r->o.steps) {
            s = save_state(r, step + 1, 0);
            t0 = seconds();
        }
    }
    if (s == DEFT_OK && r->o.state) s = save_state(r, r->o.steps > first ? r->o.steps : first, 1);
    return s;
}

/* The saved run's step count (its program's runs), after loading it into this run (under a launcher, each rank
 * from its own <resume>.rank<R>). */
static deft_status resume(run *r, int64_t *first) {
    char path[1200];
    if (!rank_path(r, path, sizeof path, r->o.resume)) return DEFT_ERR_INVALID;
    deft_train_state_summary info;
    deft_status s = deft_train_state_info(path, &info);
    if (s == DEFT_OK) s = deft_train_state_load(path, r->train, r->opt, r->loader);
    if (s != DEFT_OK) return s;
    *first = (int64_t)info.runs;
    if (lead(r)) printf("resumed from %s at step %lld\n", path, (long long)*first);
    return DEFT_OK;
}

/* Greedy decoding: the context sits in row 0 of a batch; the causal model's logits at position t - 1 see only
 * tokens 0..t-1, so the rest of the row may hold anything. */
static deft_status sample(run *r) {
    /* The graph's byte counts: the library checked them when it built the tensors. */
    const size_t x_bytes = deft_tensor_nbytes(r->m.x), logit_bytes = deft_tensor_nbytes(r->m.logits);
    const int64_t t_max = r->o.model.seq, v = r->o.model.vocab;
    int32_t *x = calloc(1, x_bytes);
    float *logits = malloc(logit_bytes);
    if (!x || !logits) {
        free(x);
        free(logits);
        fprintf(stderr, "gpt2_train: no host memory for the sample's logits (%zu bytes)\n", logit_bytes);
        return DEFT_ERR_OOM;
    }
    deft_status s = DEFT_OK;
    int64_t len = 1;
    x[0] = '\n' < v ? '\n' : 0;
    printf("sample:\n");
    for (int64_t i = 0; s == DEFT_OK && i < r->o.sample; i++) {
        s = deft_program_feed(r->eval, r->m.x, x, x_bytes);
        if (s == DEFT_OK) s = deft_program_feed(r->eval, r->m.y, x, x_bytes);
        if (s == DEFT_OK) s = deft_program_run(r->eval);
        if (s == DEFT_OK) s = deft_program_read(r->eval, r->m.logits, logits, logit_bytes);
        if (s != DEFT_OK) break;
        const float *row = logits + (len - 1) * v;
        int32_t best = 0;
        for (int32_t k = 1; k < v; k++) best = row[k] > row[best] ? k : best;
        if (v <= 256) putchar(best >= 32 || best == '\n' ? best : '?');
        else printf("%d ", best);
        if (len < t_max) x[len++] = best;
        else memmove(x, x + 1, sizeof(int32_t) * (size_t)(t_max - 1)), x[t_max - 1] = best;
    }
    printf("\n");
    free(x);
    free(logits);
    return s;
}

/* Whether a launcher started this process: a variable deft_dist_options_from_env takes the rank or world from. */
static int under_launcher(void) {
    static const char *const names[] = {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                        "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return 1;
    }
    return 0;
}

/* The device: under a launcher this rank's GPU, once it has joined the world; alone --device or the default. Returns
 * the exit status to end with, or -1 to go on. */
static int setup_device(run *r) {
    r->rank = 0;
    r->world = 1;
    if (!under_launcher()) {
        if (r->o.zero) {
            fprintf(stderr, "gpt2_train: --zero shards the optimizer's state over the ranks of a launcher's world: run "
                            "it under one (scripts/deft_launch -n N gpt2_train ... --zero)\n");
            return 2;
        }
        if (r->o.reduce_bf16) {
            fprintf(stderr, "gpt2_train: --reduce-bf16 averages the gradients over the ranks of a launcher's world: "
                            "run it under one (scripts/deft_launch -n N gpt2_train ... --reduce-bf16)\n");
            return 2;
        }
        r->dev = deft_device_default();
        if (r->o.device && deft_device_parse(r->o.device, &r->dev) != DEFT_OK) {
            fprintf(stderr, "gpt2_train: %s\n", deft_errmsg());
            return 2;
        }
        return -1;
    }
    if (r->o.device) {
        fprintf(stderr, "gpt2_train: --device: under a launcher (RANK, WORLD_SIZE set) each rank trains on its own "
                        "GPU, cuda:LOCAL_RANK; leave --device out\n");
        return 2;
    }
    char rendezvous[512];
    deft_dist_options dist = {.timeout_s = r->o.dist_timeout, .collective_blocks = r->o.nccl_blocks};
    if (deft_dist_options_from_env(&dist, rendezvous, sizeof rendezvous) != DEFT_OK ||
        deft_dist_init(&dist, &r->dist) != DEFT_OK) {
        fprintf(stderr, "gpt2_train: RANK or WORLD_SIZE is set, so this process trains as one rank of a data-parallel "
                        "world (scripts/deft_launch), which needs NCCL and a GPU per rank: %s\n", deft_errmsg());
        return 1;
    }
    r->rank = deft_dist_rank(r->dist, 0);
    r->world = deft_dist_world(r->dist);
    r->dev = deft_dist_device(r->dist, 0);
    return -1;
}

static void print_header(const run *r) {
    char dev_name[32];
    deft_device_name(r->dev, dev_name, sizeof dev_name);
    printf("gpt2_train: %lld layers, width %lld, %lld heads, seq %lld, vocab %lld: %.2fM parameters on %s (%s); "
           "%lld training tokens\n", (long long)r->o.model.layers, (long long)r->o.model.width,
           (long long)r->o.model.heads, (long long)r->o.model.seq, (long long)r->o.model.vocab,
           (double)gpt2_param_count(&r->o.model) / 1e6, dev_name,
           r->o.autocast == DEFT_BF16 ? "bf16 autocast" : r->o.autocast == DEFT_F16 ? "f16 autocast" : "f32",
           (long long)deft_tokens_count(r->d.train));
    if (r->dist)
        printf("data parallel: %d ranks, one GPU each, global batch %lld sequences (%lld a rank)%s\n", r->world,
               (long long)(r->o.batch * r->world), (long long)r->o.batch,
               r->o.zero ? ", ZeRO-1: the optimizer's state sharded over the ranks" : "");
}

/* After training: rank 0 validates; every rank traces one more step (it all-reduces, so all take part) into its own
 * file; rank 0 samples. */
static deft_status finish(run *r) {
    double vl = 0;
    deft_status s = lead(r) ? validate(r, &vl) : DEFT_OK;
    if (s == DEFT_OK && lead(r) && isnan(vl))
        printf("no validation loss: the validation tokens hold less than one batch\n");
    else if (s == DEFT_OK && lead(r)) printf("validation loss %.4f\n", vl);
    if (s == DEFT_OK && r->o.trace) {
        char path[1200];
        s = rank_path(r, path, sizeof path, r->o.trace) ? deft_loader_next(r->loader, r->train, NULL)
                                                        : DEFT_ERR_INVALID;
        if (s == DEFT_OK) s = deft_program_trace(r->train, path);
        if (s == DEFT_OK && lead(r)) printf("trace of one more step written to %s\n", path);
    }
    if (s == DEFT_OK && lead(r) && r->o.sample) s = sample(r);
    return s;
}

int main(int argc, char **argv) {
    example_help(argc, argv, help);
    run r;
    memset(&r, 0, sizeof r);
    if (!parse(argc, argv, &r.o)) {
        fprintf(stderr, "usage: gpt2_train [--model 124M] [--tokens PATTERN | --text FILE] [--steps N] ... "
                        "(--help lists them)\n");
        return 2;
    }
    const int early = setup_device(&r);
    if (early >= 0) return early;
    if (!r.o.autocast_set) r.o.autocast = r.dev.type == DEFT_CPU ? DEFT_F32 : DEFT_BF16;
    deft_status s = data_open(&r.d, &r.o);
    if (s != DEFT_OK) {
        fprintf(stderr, "gpt2_train: the data: %s\n", r.d.why[0] ? r.d.why : deft_errmsg());
        data_close(&r.d);
        deft_dist_free(r.dist);
        return 1;
    }
    if (lead(&r)) print_header(&r);
    s = build(&r);
    if (s == DEFT_OK && r.o.init_out && lead(&r)) {
        s = write_init(r.opt, r.o.init_out);
        if (s != DEFT_OK) fprintf(stderr, "gpt2_train: cannot write the initial weights to %s\n", r.o.init_out);
        else printf("initial weights written to %s\n", r.o.init_out);
    }
    if (s == DEFT_OK && r.o.print_plan && lead(&r)) s = deft_program_print_plan(r.train, NULL);
    int64_t first = 0;
    if (s == DEFT_OK && r.o.resume) s = resume(&r, &first);
    if (s == DEFT_OK) {
        if (lead(&r)) print_memory(&r);
        s = train(&r, first);
    }
    if (s == DEFT_OK) s = finish(&r);
    if (s != DEFT_OK) fprintf(stderr, "gpt2_train: %s\n", deft_errmsg());
    deft_loader_free(r.loader);
    deft_tokens_feed_free(r.feed);
    deft_graph_free(r.m.g);
    deft_dist_free(r.dist);   /* after the programs compiled with it */
    data_close(&r.d);
    deft_memory_release_all();
    return s == DEFT_OK ? 0 : 1;
}
