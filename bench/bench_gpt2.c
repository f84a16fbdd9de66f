/* bench_gpt2: the speed and memory of one GPT-2 training step compiled by deft (issue 29). The model of
 * examples/gpt2.h (GPT-2 124M by default: 12 layers, width 768, 12 heads, T = 1024, vocabulary 50304), bf16 autocast,
 * AdamW (betas 0.9 and 0.95, eps 1e-8, weight decay 0.1 on the 2-D weights only: deft_optimizer_decay_2d_only; deft's
 * optimizer updates every parameter in one fused pass) with gradient clipping to 1.0, on random tokens.
 * bench/peers/gpt2.py trains the same model in PyTorch in each of its modes and prints the same names with "torch_"
 * in place of "deft_"; scripts/bench_gpt2.sh runs both and prints the ratios. One figure per line:
 * `<name> <value> <unit>`, named gpt2.<key>.deft_<figure> with key "<model>_b<B>_<precision>" (model "124m", or
 * "l<L>_c<C>_h<H>_t<T>_v<V>" when an option changes it).
 *
 * A step is what a training loop does: feed the next batch (deft_program_feed_async from pinned host memory, cycling
 * FEED_BATCHES batches: the copy overlaps the step before) and run the program (forward, loss, backward, clipping,
 * the update). Tokens: x[i] = hash32(1, k B T + i) mod V and y[i] = hash32(2, k B T + i) mod V for batch k
 * (bench_util.h; gpt2.py computes the same), so the loss starts near ln V and stays there.
 *
 * Timing (as bench_mlp_train): --warmup steps (the loss of the first is printed), then --steps steps a repeat (by
 * default CALIBRATE steps choose N so that a repeat takes about TARGET_REPEAT_S), then --repeats repeats of a host
 * clock around N steps and one read of the loss (the read waits for the device). Figures: the median over the repeats
 * of the time of a step (the fastest and slowest beside it), tokens/s = B T / that, and MFU = flops_per_token *
 * tokens/s / (--peak-tflops 1e12), with nanoGPT's (PaLM's) estimate flops_per_token = 6 N + 12 L H Q T, Q = C / H,
 * N the parameters less the position table (as nanoGPT's get_num_params counts them; the tied head counts once).
 * The peak defaults to the H100 SXM's dense bf16 989 TFLOP/s (1979 is its sparse figure).
 *
 * Memory: peak_bytes is the caching allocator's peak of allocated bytes from before the graph was built to the end
 * (parameters, gradients, AdamW's moments, the batch, the arena, workspaces: as torch.cuda.max_memory_allocated) and
 * peak_reserved_bytes its peak of reserved bytes (torch.cuda.max_memory_reserved); beside them the plan's arena,
 * persistent, workspace and footprint bytes (deft_program_memory, deft_program_footprint), activation_bytes (of the
 * arena, the peak of forward values kept for the backward pass) and what checkpointing did (deft_program_checkpoint:
 * the planned peak with and without it, the bytes dropped and the recompute work), with --checkpoint-budget BYTES
 * the budget the search fits (DEFT_CHECKPOINT_BUDGET). --largest-batch asks deft_largest_batch, before anything is
 * built to run, for the largest batch whose step fits the device's free memory (deft_device_memory), planning only,
 * and prints the bytes planned for it and for the next batch (the one refused).
 *
 * --activation-fraction F (0 < F <= 1; a decimal or N/D, as 1/3) asks the budget search for F of the activation bytes
 * (issue 29: "activation bytes / 3 at <= +10 % step time, / 5 at <= +20 %"). The step is first planned without
 * checkpointing, by the planning path --largest-batch takes (plan_step: nothing allocated, nothing run), for its
 * planned peak P (arena + persistent: what the budget bounds) and its activation bytes A; the step then compiles with
 * DEFT_CHECKPOINT_BUDGET and the budget P - (1 - F) A, the peak less the activations that are not to stay, lowered
 * by what a plan at it keeps above F A and planned again, then raised by halves while it still keeps at most F A
 * (fraction_refine; at most 14 plans), since a budget bounds the peak and not the activations (the recomputed values
 * live at the peak too) and the bytes kept fall in steps. Its
 * figures are those above, under the key "<model>_b<B>_<precision>_af<F>", F to two decimals with a 'p' for the
 * point (1/3: "_af0p33"; a dot would split the name), so that the points of a curve never collide in one log; beside
 * them deft_activation_fraction, deft_checkpoint_budget_bytes (the budget used), deft_checkpoint_budget_first_bytes
 * (P - (1 - F) A), deft_checkpoint_budget_plans and the plan without checkpointing:
 * deft_activation_bytes_without_checkpointing (A) and deft_planned_peak_bytes_before_budget (P). Where the search's
 * floor lies above F A the activation bytes reached sit above it; the report's activation_bytes says where they
 * landed. scripts/bench_gpt2_checkpoint.sh
 * runs the curve beside PyTorch's torch.utils.checkpoint per block and its activation memory budget
 * (bench/peers/gpt2.py --checkpoint).
 *
 * Without a usable GPU (and without --device cpu) the bench says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_gpt2"
#include "../examples/gpt2.h"
#include "bench_util.h"

#define FEED_BATCHES 4
#define CALIBRATE 5
#define TARGET_REPEAT_S 1.0
#define MAX_REPEATS 101
#define LARGEST_MAX_BATCH 4096

typedef struct options {
    gpt2_config model;
    int64_t batch, steps, warmup, repeats;
    double peak_tflops;
    size_t checkpoint_budget;
    double activation_fraction;   /* 0: not given */
    int64_t loss_chunks;          /* gpt2_build_options.loss_chunks (1: the whole logits at once) */
    deft_dtype autocast;
    int no_cuda_graphs, largest_batch;
    const char *device;
} options;

/* One training step's graph: the model, its backward pass, AdamW and the step node. */
typedef struct step_graph {
    gpt2 m;
    deft_optimizer *opt;
    deft_tensor *step;
} step_graph;

/* The model built into a graph given by the caller (deft_largest_batch's probes get one), then backward, AdamW and
 * its step: the one path the measured run and the probes both take, so that the batch deft_largest_batch answers is
 * that of the graph that runs. The probes, which are only planned, build it with shapes_only (the same nodes, no
 * normal draws of the parameters). */
static deft_status build_step(step_graph *s, deft_graph *g, const gpt2_config *c, int64_t batch, deft_device dev,
                              const gpt2_build_options *bo) {
    gpt2 *m = &s->m;
    deft_graph_set_seed(g, 1337);
    deft_status st = gpt2_build_with(m, g, c, batch, dev, bo);
    if (st != DEFT_OK) return st;
    if ((st = deft_backward(m->loss)) != DEFT_OK) return st;
    const deft_adamw_options ao = {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    s->opt = deft_adamw(g, &ao, &(deft_step_options){.max_grad_norm = 1.0});
    if (!s->opt) return deft_graph_error(g);
    if ((st = deft_optimizer_decay_2d_only(s->opt)) != DEFT_OK) return st;
    s->step = deft_optimizer_step(s->opt);
    return s->step ? DEFT_OK : deft_graph_error(g);
}

typedef struct probe_ctx {
    const gpt2_config *c;
    deft_device dev;
    int64_t loss_chunks;
} probe_ctx;

static deft_status build_probe(deft_graph *g, int64_t batch, void *ctx, deft_tensor **outputs, int *n_outputs) {
    const probe_ctx *pc = ctx;
    step_graph s;
    const gpt2_build_options bo = {.shapes_only = 1, .loss_chunks = pc->loss_chunks};
    deft_status st = build_step(&s, g, pc->c, batch, pc->dev, &bo);
    if (st != DEFT_OK) return st;
    outputs[0] = s.m.loss;
    outputs[1] = s.step;
    *n_outputs = 2;
    return DEFT_OK;
}

/* What a step plans for before anything is allocated or run. */
typedef struct step_plan {
    size_t peak;          /* arena + persistent: what deft_largest_batch compares with the bytes given, and what a
                           * checkpoint budget bounds */
    size_t activations;   /* of the arena, the peak of saved activations (deft_device_footprint.activation_bytes) */
} step_plan;

/* Plans a step of `batch` (the graph the probes build) without running it. The compile stops before its last stage,
 * the budget check (compile.h lists the stages): the plan is then complete and nothing is allocated, as in
 * deft_plan_memory, and the program still answers deft_program_footprint, which gives the activation bytes. */
static deft_status plan_step(probe_ctx *pc, int64_t batch, const deft_compile_options *co, step_plan *out) {
    deft_graph *g = deft_graph_new();
    if (!g) return DEFT_ERR_OOM;
    deft_compile_options plan = *co;
    plan.stop_after = deft_compile_stage_name(deft_compile_stage_count() - 2);
    deft_tensor *outs[2];
    int n = 0, nfp = 0;
    deft_program *p = NULL;
    deft_memory_report r;
    deft_device_footprint fp[4];
    deft_status s = build_probe(g, batch, pc, outs, &n);
    if (s == DEFT_OK && deft_graph_error(g) != DEFT_OK) s = deft_graph_error(g);
    if (s == DEFT_OK && !(p = deft_compile(g, outs, n, &plan))) s = DEFT_ERR_INVALID;
    if (s == DEFT_OK) s = deft_program_memory(p, &r);
    if (s == DEFT_OK) s = deft_program_footprint(p, fp, 4, &nfp);
    if (s == DEFT_OK) {
        out->peak = r.arena_bytes + r.persistent_bytes;
        out->activations = 0;
        for (int i = 0; i < nfp; i++) out->activations += fp[i].activation_bytes;
    }
    deft_program_free(p);
    deft_graph_free(g);
    return s;
}

static void largest_batch(const options *o, deft_device dev, const deft_compile_options *co, const char *k) {
    size_t free_b = 0, total_b = 0;
    CHECK(deft_device_memory(dev, &free_b, &total_b));
    probe_ctx pc = {&o->model, dev, o->loss_chunks};
    /* The probes plan without a budget (deft_largest_batch clears it): the bytes given are the budget. */
    deft_compile_options plan = *co;
    plan.memory_budget = 0;
    plan.checkpoint = DEFT_CHECKPOINT_NONE;
    int64_t best = 0;
    step_plan need, next;
    const double t0 = seconds();
    const deft_status s = deft_largest_batch(build_probe, &pc, free_b, LARGEST_MAX_BATCH, &plan, &best);
    const double took = seconds() - t0;
    printf("gpt2.%s.deft_largest_batch_free_bytes %zu bytes\n", k, free_b);
    printf("gpt2.%s.deft_largest_batch_total_bytes %zu bytes\n", k, total_b);
    if (s != DEFT_OK) {
        printf("# gpt2.%s: deft_largest_batch: %s: %s\n", k, deft_status_name(s), deft_errmsg());
        fflush(stdout);
        return;
    }
    CHECK(plan_step(&pc, best, &plan, &need));
    printf("gpt2.%s.deft_largest_batch %lld sequences\n", k, (long long)best);
    printf("gpt2.%s.deft_largest_batch_planned_bytes %zu bytes\n", k, need.peak);
    printf("gpt2.%s.deft_largest_batch_seconds %.3f s\n", k, took);
    if (best < LARGEST_MAX_BATCH && plan_step(&pc, best + 1, &plan, &next) == DEFT_OK)
        printf("gpt2.%s.deft_largest_batch_next_planned_bytes %zu bytes\n", k, next.peak);
    fflush(stdout);
}

/* The search fits a peak, not activation bytes, and a plan at budget P - (1 - F) A keeps somewhat more than F A (the
 * peak falls by less than the activations dropped where it is not at the activations' peak). So the budget is lowered
 * by what the plan keeps above F A and planned again; a budget below what the search can reach is tried again halfway
 * back. The bytes kept fall in steps as the budget falls, so the first budget that keeps at most F A may drop far more
 * than asked (and recompute more): the budget is then raised by halves toward the last one that kept too much, while
 * it still keeps at most F A, to within 1/128 of the budget. At most FRACTION_PLANS plans. Returns the highest
 * budget found that keeps at most F A (the lowest reached when none does). */
#define FRACTION_PLANS 14
static size_t fraction_refine(probe_ctx *pc, int64_t batch, const deft_compile_options *co, size_t budget,
                              size_t want, const char *k) {
    deft_compile_options plan = *co;
    plan.checkpoint = DEFT_CHECKPOINT_BUDGET;
    plan.memory_budget = budget;
    step_plan at;
    int plans = 1;
    deft_status s = plan_step(pc, batch, &plan, &at);
    size_t step = s == DEFT_OK && at.activations > want ? at.activations - want : 0;
    size_t too_much = step ? budget : 0;   /* the lowest budget seen whose plan keeps more than F A; 0: none */
    while (step > 0 && step < budget && plans < FRACTION_PLANS) {
        plan.memory_budget = budget - step;
        plans++;
        if (plan_step(pc, batch, &plan, &at) == DEFT_OK) {
            budget -= step;
            step = at.activations > want ? at.activations - want : 0;
            if (step) too_much = budget;
        } else {
            step /= 2;   /* below the search's floor */
        }
    }
    const int met = s == DEFT_OK && step == 0;
    while (met && too_much > budget && too_much - budget > too_much / 128 && plans < FRACTION_PLANS) {
        plan.memory_budget = budget + (too_much - budget) / 2;
        plans++;
        if (plan_step(pc, batch, &plan, &at) == DEFT_OK && at.activations <= want) budget = plan.memory_budget;
        else too_much = plan.memory_budget;
    }
    printf("gpt2.%s.deft_checkpoint_budget_plans %d count\n", k, plans);
    return budget;
}

/* --activation-fraction: plans the step without checkpointing (plan_step: nothing runs) for its peak P and activation
 * bytes A, then sets the budget search on P - (1 - F) A, the peak less the activations not to keep, lowered until the
 * plan keeps at most F A and raised again as far as it still does (fraction_refine). */
static deft_status fraction_budget(const options *o, deft_device dev, deft_compile_options *co, const char *k) {
    probe_ctx pc = {&o->model, dev, o->loss_chunks};
    deft_compile_options plan = *co;
    plan.memory_budget = 0;
    plan.checkpoint = DEFT_CHECKPOINT_NONE;
    step_plan without;
    const double t0 = seconds();
    deft_status s = plan_step(&pc, o->batch, &plan, &without);
    if (s != DEFT_OK) {
        printf("# gpt2.%s: planning without checkpointing: %s: %s\n", k, deft_status_name(s), deft_errmsg());
        fflush(stdout);
        return s;
    }
    /* A is a part of the arena, so the budget stays above the persistent bytes; it is never 0 (no budget). */
    const size_t drop = (size_t)((1.0 - o->activation_fraction) * (double)without.activations);
    const size_t first = drop < without.peak ? without.peak - drop : 1;
    const size_t want = (size_t)(o->activation_fraction * (double)without.activations);
    const size_t budget = fraction_refine(&pc, o->batch, &plan, first, want, k);
    printf("gpt2.%s.deft_activation_fraction %.6f fraction\n", k, o->activation_fraction);
    printf("gpt2.%s.deft_checkpoint_budget_first_bytes %zu bytes\n", k, first);
    printf("gpt2.%s.deft_planned_peak_bytes_before_budget %zu bytes\n", k, without.peak);
    printf("gpt2.%s.deft_activation_bytes_without_checkpointing %zu bytes\n", k, without.activations);
    printf("gpt2.%s.deft_checkpoint_budget_bytes %zu bytes\n", k, budget);
    printf("gpt2.%s.deft_budget_plan_s %.3f s\n", k, seconds() - t0);
    fflush(stdout);
    co->memory_budget = budget;
    co->checkpoint = DEFT_CHECKPOINT_BUDGET;
    return DEFT_OK;
}

/* The FEED_BATCHES batches of tokens, in pinned host memory (x then y of batch k at xs[k], ys[k]). */
typedef struct feed {
    int32_t *xs[FEED_BATCHES], *ys[FEED_BATCHES];
    size_t bytes;
    int64_t next;
} feed;

static void feed_make(feed *f, const options *o) {
    const uint64_t n = (uint64_t)(o->batch * o->model.seq);
    f->bytes = (size_t)n * sizeof(int32_t);
    for (int k = 0; k < FEED_BATCHES; k++) {
        CHECK(deft_pinned_alloc(f->bytes, (void **)&f->xs[k]));
        CHECK(deft_pinned_alloc(f->bytes, (void **)&f->ys[k]));
        for (uint64_t i = 0; i < n; i++) {
            f->xs[k][i] = (int32_t)(hash32(1, (uint64_t)k * n + i) % (uint64_t)o->model.vocab);
            f->ys[k][i] = (int32_t)(hash32(2, (uint64_t)k * n + i) % (uint64_t)o->model.vocab);
        }
    }
}

static void feed_free(feed *f) {
    for (int k = 0; k < FEED_BATCHES; k++) {
        if (f->xs[k]) deft_pinned_free(f->xs[k]);
        if (f->ys[k]) deft_pinned_free(f->ys[k]);
    }
}

static deft_status run_steps(deft_program *p, step_graph *s, feed *f, int64_t n, float *loss) {
    deft_status st = DEFT_OK;
    for (int64_t i = 0; st == DEFT_OK && i < n; i++) {
        const int64_t k = f->next++ % FEED_BATCHES;
        st = deft_program_feed_async(p, s->m.x, f->xs[k], f->bytes);
        if (st == DEFT_OK) st = deft_program_feed_async(p, s->m.y, f->ys[k], f->bytes);
        if (st == DEFT_OK) st = deft_program_run(p);
    }
    if (st == DEFT_OK) st = deft_program_read(p, s->m.loss, loss, sizeof *loss);
    return st;
}

typedef struct result {
    double ms[MAX_REPEATS];
    int64_t n, steps;
    float loss_first, loss;
} result;

static deft_status measure(deft_program *p, step_graph *s, feed *f, const options *o, result *r) {
    deft_status st = run_steps(p, s, f, 1, &r->loss_first);
    if (st == DEFT_OK && o->warmup > 1) st = run_steps(p, s, f, o->warmup - 1, &r->loss);
    r->steps = o->warmup;
    r->n = o->steps;
    if (st == DEFT_OK && !r->n) {
        const double t0 = seconds();
        st = run_steps(p, s, f, CALIBRATE, &r->loss);
        const double per = (seconds() - t0) / CALIBRATE;
        r->n = (int64_t)ceil(TARGET_REPEAT_S / (per > 1e-9 ? per : 1e-9));
        r->steps += CALIBRATE;
    }
    if (r->n < 1) r->n = 1;
    for (int k = 0; st == DEFT_OK && k < o->repeats; k++) {
        const double t0 = seconds();
        st = run_steps(p, s, f, r->n, &r->loss);
        r->ms[k] = (seconds() - t0) / (double)r->n * 1e3;
        r->steps += r->n;
    }
    sort_times(r->ms, (int)o->repeats);
    return st;
}

/* nanoGPT's estimate_mfu: 6 N + 12 L H Q T a token, N without the position table. */
static double flops_per_token(const gpt2_config *c) {
    const double n = (double)(gpt2_param_count(c) - c->seq * c->width);
    return 6.0 * n + 12.0 * (double)c->layers * (double)c->heads * (double)(c->width / c->heads) * (double)c->seq;
}

static deft_status report(deft_program *p, deft_device dev, const options *o, const char *k, const char *tag,
                          const result *r) {
    deft_memory_report mr;
    deft_memory_stats ms;
    deft_checkpoint_report cr;
    deft_device_footprint fp[4];
    int nfp = 0;
    deft_status s = deft_program_memory(p, &mr);
    if (s == DEFT_OK) s = deft_program_footprint(p, fp, 4, &nfp);
    if (s == DEFT_OK) s = deft_program_checkpoint(p, &cr);
    if (s == DEFT_OK) s = deft_memory_stats_get(dev, &ms);
    if (s != DEFT_OK) return s;
    size_t footprint = 0, activations = 0, workspace = 0;
    for (int i = 0; i < nfp; i++)
        footprint += fp[i].total_bytes, activations += fp[i].activation_bytes, workspace += fp[i].workspace_bytes;
    const double med = r->ms[o->repeats / 2], tokens = (double)(o->batch * o->model.seq);
    const double tps = tokens / (med * 1e-3), fpt = flops_per_token(&o->model);
    printf("gpt2.%s.%s_step_ms %.3f ms\n", k, tag, med);
    printf("gpt2.%s.%s_step_ms_min %.3f ms\n", k, tag, r->ms[0]);
    printf("gpt2.%s.%s_step_ms_max %.3f ms\n", k, tag, r->ms[o->repeats - 1]);
    printf("gpt2.%s.%s_steps_per_repeat %lld count\n", k, tag, (long long)r->n);
    printf("gpt2.%s.%s_tokens_per_s %.1f tokens/s\n", k, tag, tps);
    printf("gpt2.%s.%s_tflops %.3f TFLOP/s\n", k, tag, fpt * tps / 1e12);
    printf("gpt2.%s.%s_mfu %.2f %%\n", k, tag, 100.0 * fpt * tps / (o->peak_tflops * 1e12));
    printf("gpt2.%s.%s_peak_bytes %lld bytes\n", k, tag, (long long)ms.allocated_bytes.peak);
    printf("gpt2.%s.%s_peak_reserved_bytes %lld bytes\n", k, tag, (long long)ms.reserved_bytes.peak);
    printf("gpt2.%s.%s_arena_bytes %zu bytes\n", k, tag, mr.arena_bytes);
    printf("gpt2.%s.%s_arena_lower_bound_bytes %zu bytes\n", k, tag, mr.lower_bound_bytes);
    printf("gpt2.%s.%s_persistent_bytes %zu bytes\n", k, tag, mr.persistent_bytes);
    printf("gpt2.%s.%s_workspace_bytes %zu bytes\n", k, tag, workspace);
    printf("gpt2.%s.%s_footprint_bytes %zu bytes\n", k, tag, footprint);
    printf("gpt2.%s.%s_activation_bytes %zu bytes\n", k, tag, activations);
    printf("gpt2.%s.%s_planned_peak_bytes %zu bytes\n", k, tag, cr.peak_bytes);
    printf("gpt2.%s.%s_planned_peak_bytes_without_checkpointing %zu bytes\n", k, tag, cr.peak_bytes_without);
    printf("gpt2.%s.%s_checkpoint_dropped_bytes %zu bytes\n", k, tag, cr.dropped_bytes);
    printf("gpt2.%s.%s_checkpoint_recomputed %d nodes\n", k, tag, cr.recomputed);
    printf("gpt2.%s.%s_checkpoint_recompute_gflop %.3f GFLOP\n", k, tag, cr.recompute_flops / 1e9);
    printf("gpt2.%s.%s_graph_replays %lld count\n", k, tag, (long long)deft_program_graph_replays(p));
    printf("gpt2.%s.%s_loss_first %.6f loss\n", k, tag, (double)r->loss_first);
    printf("gpt2.%s.%s_loss %.6f loss\n", k, tag, (double)r->loss);
    printf("gpt2.%s.%s_loss_steps %lld count\n", k, tag, (long long)r->steps);
    fflush(stdout);
    return DEFT_OK;
}

static deft_status bench(const options *o, deft_device dev, const deft_compile_options *co, const char *k) {
    const char *tag = co->no_cuda_graphs ? "deft_nographs" : "deft";
    step_graph s = {0};
    feed f = {0};
    result r = {{0}, 0, 0, 0, 0};
    deft_program *p = NULL;
    deft_graph *g = NULL;
    deft_status st = deft_memory_reset_peak(dev);
    if (st == DEFT_OK && !(g = deft_graph_new())) st = DEFT_ERR_OOM;
    if (st == DEFT_OK) st = build_step(&s, g, &o->model, o->batch, dev, &(gpt2_build_options){.loss_chunks = o->loss_chunks});
    if (st == DEFT_OK && deft_graph_error(g) != DEFT_OK) st = deft_graph_error(g);
    if (st == DEFT_OK) {
        const double t0 = seconds();
        if (!(p = deft_compile(g, (deft_tensor *[]){s.m.loss, s.step}, 2, co))) st = DEFT_ERR_INVALID;
        else printf("gpt2.%s.%s_compile_s %.3f s\n", k, tag, seconds() - t0);
    }
    if (st == DEFT_OK) feed_make(&f, o);
    if (st == DEFT_OK) st = measure(p, &s, &f, o, &r);
    if (st == DEFT_OK) st = report(p, dev, o, k, tag, &r);
    if (st != DEFT_OK) {
        printf("# gpt2.%s: %s failed: %s: %s\n", k, tag, deft_status_name(st),
               g && deft_graph_error(g) != DEFT_OK ? deft_graph_errmsg(g) : deft_errmsg());
        fflush(stdout);
    }
    deft_graph_free(g);
    feed_free(&f);
    return st;
}

static const char help[] =
    "usage: bench_gpt2 [--batch B] [--seq T] [--layers L] [--width C] [--heads H] [--vocab V] [--steps N]\n"
    "                  [--warmup W] [--repeats R] [--device cuda:N|cpu] [--autocast bf16|f32]\n"
    "                  [--checkpoint-budget BYTES | --activation-fraction F] [--no-cuda-graphs] [--peak-tflops P]\n"
    "                  [--loss-chunks K] [--largest-batch] [A/B options]\n"
    "\n"
    "The time and memory of one GPT-2 training step (feed, forward, loss, backward, clipping, fused AdamW) compiled\n"
    "by deft, on random tokens: step ms, tokens/s, MFU, peak and planned bytes, activation bytes, and with\n"
    "--largest-batch the largest batch deft_largest_batch finds for the device's free memory. One figure per line:\n"
    "<name> <value> <unit>. bench/peers/gpt2.py is the PyTorch peer; scripts/bench_gpt2.sh runs both.\n"
    "\n"
    "  --batch B                  sequences a step (default: 16)\n"
    "  --seq T                    sequence length (default: 1024)\n"
    "  --layers L                 blocks (default: 12)\n"
    "  --width C                  model width (default: 768)\n"
    "  --heads H                  attention heads, dividing the width (default: 12)\n"
    "  --vocab V                  vocabulary (default: 50304, GPT-2's padded as nanoGPT and llm.c pad it)\n"
    "  --steps N                  timed steps a repeat (default: as many as take about 1 s)\n"
    "  --warmup W                 untimed steps first, at least 1 (default: 20)\n"
    "  --repeats R                timed repeats, the median reported (default: 7; at most 101)\n"
    "  --device cuda:N|cpu        where it runs (default: cuda:0 when a GPU works, else the bench skips)\n"
    "  --autocast bf16|f32        mixed precision (default: bf16)\n"
    "  --checkpoint-budget BYTES  activation checkpointing to fit BYTES a step (suffix K, M or G; the figures' key\n"
    "                             gets _cb<megabytes>; default: none)\n"
    "  --activation-fraction F    activation checkpointing to keep F of the activation bytes, 0 < F <= 1, a decimal\n"
    "                             or N/D (1/3: the activations / 3): the step is planned without checkpointing\n"
    "                             (nothing runs) for its peak P and activation bytes A, then compiled with the\n"
    "                             budget P - (1 - F) A, lowered while a plan keeps more than F A and raised\n"
    "                             again by halves while it keeps at most F A; the figures' key gets _af<F>\n"
    "                             (1/3: _af0p33) (default: none)\n"
    "  --loss-chunks K            the loss over K blocks of rows, each block's logits its own product and\n"
    "                             cross-entropy, so that checkpointing can recompute one block's logits at a time\n"
    "                             (K divides B T; the figures' key gets _lc<K>; default: 1, the whole logits)\n"
    "  --no-cuda-graphs           every step launched kernel by kernel (default: CUDA Graph replays)\n"
    "  --peak-tflops P            the device's dense peak for MFU (default: 989, the H100 SXM's bf16)\n"
    "  --largest-batch            also ask deft_largest_batch for the largest batch the free memory fits\n"
    BENCH_AB_HELP
    "  -h, --help                 this help\n";

static void usage(void) {
    fprintf(stderr,
            "usage: %s [--batch B] [--seq T] [--layers L] [--width C] [--heads H] [--vocab V] [--steps N] "
            "[--warmup W] [--repeats R] [--device cuda:N|cpu] [--autocast bf16|f32] [--checkpoint-budget BYTES | "
            "--activation-fraction F] [--loss-chunks K] [--no-cuda-graphs] [--peak-tflops P] [--largest-batch] "
            BENCH_AB_USAGE
            " (--help says more)\n",
            prog);
    exit(2);
}

/* A count with nothing after its digits, within [lo, hi]. */
static int64_t parse_count(const char *s, int64_t lo, int64_t hi) {
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) usage();
    return v;
}

static size_t parse_bytes(const char *s) {
    char *end = NULL;
    const double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v)) usage();
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mult = 1073741824.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v * mult >= 1.8e19) usage();
    return (size_t)(v * mult);
}

/* A number F with 0 < F <= 1, written as a decimal or as N/D ("1/3" asks for the activations / 3). */
static double parse_fraction(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end != s && *end == '/') {
        const char *d = end + 1;
        const double den = strtod(d, &end);
        v = end == d ? NAN : v / den;
    }
    if (end == s || *end || !isfinite(v) || !(v > 0) || v > 1) {
        fprintf(stderr, "%s: --activation-fraction %s: want a number F with 0 < F <= 1 (a decimal, or N/D as 1/3)\n",
                prog, s);
        exit(2);
    }
    return v;
}

/* An option with a value; 0 when `a` is none of them. */
static int parse_value(options *o, const char *a, const char *v) {
    if (!strcmp(a, "--batch")) o->batch = parse_count(v, 1, 1 << 20);
    else if (!strcmp(a, "--seq")) o->model.seq = parse_count(v, 1, 1 << 20);
    else if (!strcmp(a, "--layers")) o->model.layers = parse_count(v, 1, 64);
    else if (!strcmp(a, "--width")) o->model.width = parse_count(v, 1, 1 << 20);
    else if (!strcmp(a, "--heads")) o->model.heads = parse_count(v, 1, 1 << 20);
    else if (!strcmp(a, "--vocab")) o->model.vocab = parse_count(v, 1, (int64_t)1 << 31);
    else if (!strcmp(a, "--steps")) o->steps = parse_count(v, 1, 1000000);
    else if (!strcmp(a, "--warmup")) o->warmup = parse_count(v, 1, 1000000);
    else if (!strcmp(a, "--repeats")) o->repeats = parse_count(v, 1, MAX_REPEATS);
    else if (!strcmp(a, "--device")) o->device = v;
    else if (!strcmp(a, "--checkpoint-budget")) o->checkpoint_budget = parse_bytes(v);
    else if (!strcmp(a, "--activation-fraction")) o->activation_fraction = parse_fraction(v);
    else if (!strcmp(a, "--loss-chunks")) o->loss_chunks = parse_count(v, 1, 1 << 20);
    else if (!strcmp(a, "--peak-tflops")) {
        char *end = NULL;
        o->peak_tflops = strtod(v, &end);
        if (end == v || *end || !(o->peak_tflops > 0) || !isfinite(o->peak_tflops)) usage();
    } else if (!strcmp(a, "--autocast")) {
        if (!strcmp(v, "bf16")) o->autocast = DEFT_BF16;
        else if (!strcmp(v, "f32")) o->autocast = DEFT_F32;
        else usage();
    } else
        return 0;
    return 1;
}

static void parse(int argc, char **argv, options *o, deft_compile_options *co) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-cuda-graphs")) co->no_cuda_graphs = 1;
        else if (!strcmp(argv[i], "--largest-batch")) o->largest_batch = 1;
        else if (bench_ab_option(argc, argv, &i, co)) continue;
        else if (i + 1 < argc && parse_value(o, argv[i], argv[i + 1])) i++;
        else usage();
    }
    if (co->conv_gemm < 0) usage();
    if (o->model.width % o->model.heads) {
        fprintf(stderr, "%s: --heads %lld does not divide --width %lld\n", prog, (long long)o->model.heads,
                (long long)o->model.width);
        exit(2);
    }
    if (o->checkpoint_budget && o->activation_fraction > 0) {
        fprintf(stderr, "%s: --checkpoint-budget and --activation-fraction both set the budget: give one\n", prog);
        exit(2);
    }
    if ((o->batch * o->model.seq) % o->loss_chunks != 0) {
        fprintf(stderr, "%s: --loss-chunks %lld must divide the rows of the logits, B T = %lld\n", prog,
                (long long)o->loss_chunks, (long long)(o->batch * o->model.seq));
        exit(2);
    }
    co->autocast = o->autocast;
    if (o->checkpoint_budget) co->memory_budget = o->checkpoint_budget, co->checkpoint = DEFT_CHECKPOINT_BUDGET;
}

static void make_key(const options *o, const deft_compile_options *co, char *k, size_t n) {
    const gpt2_config d = gpt2_124m(), *c = &o->model;
    char model[96];
    if (c->layers == d.layers && c->width == d.width && c->heads == d.heads && c->seq == d.seq && c->vocab == d.vocab)
        snprintf(model, sizeof model, "124m");
    else
        snprintf(model, sizeof model, "l%lld_c%lld_h%lld_t%lld_v%lld", (long long)c->layers, (long long)c->width,
                 (long long)c->heads, (long long)c->seq, (long long)c->vocab);
    /* F to two decimals with a 'p' for the point (1/3: "_af0p33"): a dot would split the key in gpt2.<key>.<figure>. */
    char fraction[32] = "";
    if (o->activation_fraction > 0) {
        snprintf(fraction, sizeof fraction, "_af%.2f", o->activation_fraction);
        char *dot = strchr(fraction, '.');
        if (dot) *dot = 'p';
    }
    /* A budget given in bytes: "_cb<MB>", so that a budget's point keeps apart from the run without one. */
    if (o->activation_fraction <= 0 && o->checkpoint_budget > 0)
        snprintf(fraction, sizeof fraction, "_cb%lluM", (unsigned long long)((o->checkpoint_budget + 500000) / 1000000));
    char chunks[32] = "";
    if (o->loss_chunks > 1) snprintf(chunks, sizeof chunks, "_lc%lld", (long long)o->loss_chunks);
    /* --reorder: "_ro", a schedule of its own beside the given order's. */
    snprintf(k, n, "%s_b%lld_%s%s%s%s", model, (long long)o->batch, o->autocast == DEFT_BF16 ? "bf16" : "f32", chunks,
             co->reorder ? "_ro" : "", fraction);
}

int main(int argc, char **argv) {
    bench_help(argc, argv, help);
    options o = {.model = gpt2_124m(), .batch = 16, .warmup = 20, .repeats = 7, .peak_tflops = 989.0,
                 .autocast = DEFT_BF16, .loss_chunks = 1};
    deft_compile_options co = {0};
    parse(argc, argv, &o, &co);

    deft_device dev;
    if (o.device) {
        deft_status s = deft_device_parse(o.device, &dev);
        if (s == DEFT_ERR_NO_CUDA) {
            printf("%s: skipped: %s (--device cpu runs on the CPU)\n", prog, deft_errmsg());
            return 0;
        }
        if (s != DEFT_OK) {
            fprintf(stderr, "%s: --device %s: %s\n", prog, o.device, deft_errmsg());
            return 2;
        }
    } else {
        if (deft_cuda_device_count() < 1) {
            printf("%s: skipped: no usable CUDA device (--device cpu runs on the CPU)\n", prog);
            return 0;
        }
        dev = deft_cuda(0);
    }
    char k[160], dname[256], dstr[32];
    make_key(&o, &co, k, sizeof k);
    if (deft_device_name(dev, dname, sizeof dname) != DEFT_OK) snprintf(dname, sizeof dname, "?");
    char budget[64] = "";
    if (o.checkpoint_budget) snprintf(budget, sizeof budget, ", checkpoint budget");
    else if (o.activation_fraction > 0)
        snprintf(budget, sizeof budget, ", checkpoint budget for %.4g of the activations", o.activation_fraction);
    printf("# %s: deft %s on %s (%s): %lld layers, width %lld, %lld heads, T %lld, vocab %lld, batch %lld, %s%s%s\n",
           prog, deft_version(), deft_device_str(dev, dstr, sizeof dstr), dname, (long long)o.model.layers,
           (long long)o.model.width, (long long)o.model.heads, (long long)o.model.seq, (long long)o.model.vocab,
           (long long)o.batch, o.autocast == DEFT_BF16 ? "bf16 autocast" : "f32",
           co.no_cuda_graphs ? ", CUDA Graphs off" : "", budget);
    printf("gpt2.%s.params %lld count\n", k, (long long)gpt2_param_count(&o.model));
    printf("gpt2.%s.flops_per_token %.0f FLOP\n", k, flops_per_token(&o.model));
    printf("gpt2.%s.tokens_per_step %lld tokens\n", k, (long long)(o.batch * o.model.seq));
    printf("gpt2.%s.peak_tflops %.1f TFLOP/s\n", k, o.peak_tflops);
    if (o.checkpoint_budget) printf("gpt2.%s.deft_checkpoint_budget_bytes %zu bytes\n", k, o.checkpoint_budget);
    fflush(stdout);
    if (o.largest_batch) largest_batch(&o, dev, &co, k);
    deft_status s = DEFT_OK;
    if (o.activation_fraction > 0) s = fraction_budget(&o, dev, &co, k);
    if (s == DEFT_OK) s = bench(&o, dev, &co, k);
    deft_memory_release_all();
    return s == DEFT_OK ? 0 : 1;
}
