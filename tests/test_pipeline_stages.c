/* The compile pipeline stage by stage (passes/pipeline.h, the compile option stop_after), on the CPU: a small MLP's
 * training step with checkpointing (segments), optimizer in backward and reorder is compiled whole, then stopped
 * after each stage in turn. Each stopped program prints its plan and dumps its DOT graph, refuses to run, feed or be
 * read (DEFT_ERR_STATE), and shows what its stages did and nothing of the later ones: no steps before the schedule,
 * the checkpoint's recomputations from the checkpoint stage on, the optimizer's pieces from the split on, every step
 * of the whole compile from the schedule on (the CPU fuses nothing), arenas no larger after reorder than after the
 * schedule and smaller once the pieces are placed, and from optimizer_place on exactly the whole compile's plan.
 * Freeing a stopped program takes its copies out of the graph. Stopping after the last stage compiles the whole,
 * runnable program; a name that is no stage is DEFT_ERR_INVALID and lists the stages; autocast stops after its
 * rewrite. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "deft_testing.h"
#include "obwd_net.h"

static obwd_spec SPEC;   /* main sets it: a small MLP on the CPU */

/* The index of the stage of that name (the order deft_compile_stage_name gives). */
static int stage_index(const char *name) {
    for (int i = 0; i < deft_compile_stage_count(); i++)
        if (!strcmp(deft_compile_stage_name(i), name)) return i;
    CHECK_MSG(0, "no stage named %s", name);
    return -1;
}

/* What one compile decided, as the public reports and the test support tell it. */
typedef struct facts {
    int steps, recomputed, pieces;
    size_t arena;
    int buffers;
} facts;

static facts facts_of(const deft_program *p) {
    facts f = {0};
    f.steps = deft_program_step_count(p);
    deft_memory_report m;
    CHECK_OK(deft_program_memory(p, &m));
    f.arena = m.arena_bytes;
    f.buffers = m.buffers;
    deft_checkpoint_report c;
    CHECK_OK(deft_program_checkpoint(p, &c));
    f.recomputed = c.recomputed;
    deft_testing_split s;
    f.pieces = deft_testing_program_split(p, &s) ? s.n_pieces : 0;
    return f;
}

static int file_contains(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char buf[1 << 20];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* The plan print and the DOT dump of a stopped program. */
static void check_printable(obwd_net *n, deft_program *p, const char *stage, int scheduled) {
    char want[96];
    const char *plan = "test_pipeline_stages.plan.txt", *dot = "test_pipeline_stages.dot";
    FILE *f = fopen(plan, "w");
    CHECK(f != NULL);
    if (f) {
        CHECK_OK(deft_program_print_plan(p, f));
        fclose(f);
        snprintf(want, sizeof want, "compile stopped after stage %s", stage);
        CHECK_MSG(file_contains(plan, want), "%s: the plan print does not say \"%s\"", stage, want);
    }
    CHECK_OK(deft_graph_dump_dot(n->g, p, dot));
    CHECK_MSG(file_contains(dot, "digraph"), "%s: no DOT graph", stage);
    CHECK_MSG(file_contains(dot, "arena @") == scheduled, "%s: the DOT dump %s arena places", stage,
              scheduled ? "lacks" : "shows");
}

/* A stopped program refuses every use that needs memory. */
static void check_refuses(obwd_net *n, deft_program *p, const char *stage) {
    char want[96];
    snprintf(want, sizeof want, "stopped after stage %s", stage);
    CHECK_ERR(deft_program_run(p), DEFT_ERR_STATE, want);
    obwd_batch(n, 0);
    CHECK_ERR(deft_program_feed(p, n->x, n->hx, (size_t)(SPEC.batch * SPEC.width) * sizeof *n->hx), DEFT_ERR_STATE,
              want);
    float loss;
    CHECK_ERR(deft_program_read(p, n->loss, &loss, sizeof loss), DEFT_ERR_STATE, want);
}

/* The facts of the program stopped after stage i against the whole compile's (all) and the schedule's. */
static void check_facts(const char *stage, int i, const facts *f, const facts *all, const facts *sched) {
    const int schedule = stage_index("schedule"), split = stage_index("optimizer_split");
    const int ckpt = stage_index("checkpoint"), place = stage_index("optimizer_place");
    CHECK_MSG(f->steps == (i >= schedule ? all->steps : 0), "%s: %d steps (whole: %d)", stage, f->steps, all->steps);
    CHECK_MSG(f->recomputed == (i >= ckpt ? all->recomputed : 0), "%s: %d recomputed (whole: %d)", stage,
              f->recomputed, all->recomputed);
    CHECK_MSG(f->pieces == (i >= split ? all->pieces : 0), "%s: %d optimizer pieces (whole: %d)", stage, f->pieces,
              all->pieces);
    if (i < schedule) CHECK_MSG(f->arena == 0 && f->buffers == 0, "%s: an arena of %zu bytes", stage, f->arena);
    if (i > schedule && i < place)
        CHECK_MSG(f->arena <= sched->arena, "%s: arena %zu, more than the schedule's %zu", stage, f->arena,
                  sched->arena);
    if (i >= place)
        CHECK_MSG(f->arena == all->arena && f->buffers == all->buffers, "%s: arena %zu in %d buffers, whole %zu in %d",
                  stage, f->arena, f->buffers, all->arena, all->buffers);
}

static void test_each_stage(void) {
    obwd_net n;
    if (!obwd_build(&n, &SPEC)) return;
    const int before = deft_graph_node_count(n.g);
    deft_compile_options o = {.checkpoint = DEFT_CHECKPOINT_SEGMENTS, .checkpoint_segments = 2,
                              .optimizer_in_backward = 1, .reorder = 1};
    deft_program *whole = obwd_compile(&n, &o);
    CHECK_MSG(whole != NULL, "whole compile: %s", deft_errmsg());
    if (!whole) {
        obwd_free(&n);
        return;
    }
    const facts all = facts_of(whole);
    CHECK_MSG(all.steps > 0 && all.recomputed > 0 && all.pieces > 1 && all.arena > 0,
              "whole: %d steps, %d recomputed, %d pieces, arena %zu", all.steps, all.recomputed, all.pieces,
              all.arena);
    float loss = 0, norm = 0;
    CHECK(obwd_run(&n, whole, 0, &loss, &norm));
    deft_program_free(whole);
    CHECK(deft_graph_node_count(n.g) == before);
    facts sched = {0};
    for (int i = 0; i < deft_compile_stage_count() - 1; i++) {
        const char *stage = deft_compile_stage_name(i);
        o.stop_after = stage;
        deft_program *p = NULL;
        CHECK_OK(deft_compile_into(n.g, (deft_tensor *[]){n.loss, n.step}, 2, &o, &p));
        if (!p) continue;
        const facts f = facts_of(p);
        if (i == stage_index("schedule")) sched = f;
        check_facts(stage, i, &f, &all, &sched);
        check_printable(&n, p, stage, f.steps > 0);
        check_refuses(&n, p, stage);
        deft_program_free(p);
        CHECK_MSG(deft_graph_node_count(n.g) == before, "%s: %d nodes left in the graph, %d before", stage,
                  deft_graph_node_count(n.g), before);
    }
    obwd_free(&n);
}

/* Stopping after the last stage is the whole compile: the program runs, with the whole compile's loss. */
static void test_last_stage(void) {
    obwd_net a, b;
    if (!obwd_build(&a, &SPEC) || !obwd_build(&b, &SPEC)) return;
    const int count = deft_compile_stage_count();
    deft_program *pa = obwd_compile(&a, NULL);
    deft_program *pb = obwd_compile(&b, &(deft_compile_options){.stop_after = deft_compile_stage_name(count - 1)});
    CHECK_MSG(pa && pb, "compile: %s", deft_errmsg());
    float la = 0, lb = 1, na = 0, nb = 1;
    if (pa && pb) CHECK(obwd_run(&a, pa, 0, &la, &na) && obwd_run(&b, pb, 0, &lb, &nb));
    CHECK_MSG(!memcmp(&la, &lb, sizeof la) && !memcmp(&na, &nb, sizeof na), "loss %.9g and %.9g", (double)la,
              (double)lb);
    obwd_free(&a);
    obwd_free(&b);
}

static void test_names(void) {
    const int count = deft_compile_stage_count();
    CHECK(count == 9);
    CHECK(deft_compile_stage_name(-1) == NULL && deft_compile_stage_name(count) == NULL);
    for (int i = 0; i < count; i++)
        for (int j = 0; j < i; j++) CHECK(strcmp(deft_compile_stage_name(i), deft_compile_stage_name(j)) != 0);
    CHECK(!strcmp(deft_compile_stage_name(0), "autocast") && !strcmp(deft_compile_stage_name(count - 1), "budget"));
    obwd_net n;
    if (!obwd_build(&n, &SPEC)) return;
    deft_program *p = NULL;
    CHECK_ERR(deft_compile_into(n.g, (deft_tensor *[]){n.loss, n.step}, 2,
                                &(deft_compile_options){.stop_after = "fuse"}, &p),
              DEFT_ERR_INVALID, "autocast, checkpoint, optimizer_split, schedule, reorder, fusion, optimizer_place");
    CHECK(p == NULL);
    obwd_free(&n);
}

/* The autocast stage alone: the rewrite is in the graph, nothing is scheduled. */
static void test_autocast_stage(void) {
    obwd_net n;
    if (!obwd_build(&n, &SPEC)) return;
    const int before = deft_graph_node_count(n.g);
    deft_program *p = obwd_compile(&n, &(deft_compile_options){.autocast = DEFT_BF16, .stop_after = "autocast"});
    CHECK_MSG(p != NULL, "compile: %s", deft_errmsg());
    if (p) {
        CHECK_MSG(deft_graph_node_count(n.g) > before, "%d nodes after the autocast stage, %d before",
                  deft_graph_node_count(n.g), before);
        CHECK(deft_program_step_count(p) == 0);
        check_refuses(&n, p, "autocast");
    }
    deft_program_free(p);
    obwd_free(&n);
}

int main(void) {
    SPEC = (obwd_spec){.depth = 4, .batch = 8, .width = 16, .classes = 4, .device = deft_cpu()};
    test_names();
    test_each_stage();
    test_last_stage();
    test_autocast_stage();
    return deft_check_finish();
}
