/* deft_program_trace: one step, each scheduled node timed on its stream, written as a Chrome trace-event file
 * (chrome://tracing, ui.perfetto.dev). Host steps read CLOCK_MONOTONIC around them; GPU steps record a pair of
 * timing events on their stream, read once the step is done, against an origin event recorded on that stream while
 * it was idle, at the host time the trace starts: the tracks share one time axis, to the precision of that wait. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "prefetch.h"
#include "program_graph.h"
#include "program_run.h"
#include "trace.h"

typedef struct deft_trace_step {
    int lane;               /* runtime/program_lanes.h: L->n is the host */
    double begin, end;      /* microseconds from the trace's start */
    void *ev[2];            /* GPU steps: the events recorded around it */
} deft_trace_step;

struct deft_trace {
    deft_program *p;
    deft_trace_step *steps;  /* one per step of p */
    void *origin[DEFT_MAX_LANES];
    double t0;               /* host microseconds when the trace started */
};

static double deft_host_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static const deft_lanes *deft_trace_lanes(const deft_trace *tr) { return &tr->p->gpu->lanes; }

static int deft_on_host(const deft_trace *tr, int lane) { return lane >= deft_trace_lanes(tr)->n; }

deft_status deft_trace_step_begin(deft_trace *tr, int i, void *stream) {
    deft_trace_step *st = &tr->steps[i];
    if (deft_on_host(tr, st->lane)) {
        st->begin = deft_host_us() - tr->t0;
        return DEFT_OK;
    }
    return deft_prefetch_cuda_record(deft_trace_lanes(tr)->device[st->lane], st->ev[0], stream);
}

deft_status deft_trace_step_end(deft_trace *tr, int i, void *stream) {
    deft_trace_step *st = &tr->steps[i];
    if (deft_on_host(tr, st->lane)) {
        st->end = deft_host_us() - tr->t0;
        return DEFT_OK;
    }
    return deft_prefetch_cuda_record(deft_trace_lanes(tr)->device[st->lane], st->ev[1], stream);
}

/* ---- the events: made before the step, outside any capture, and freed before returning ---- */

static void deft_trace_free(deft_trace *tr) {
    const deft_lanes *L = deft_trace_lanes(tr);
    for (int i = 0; tr->steps && i < tr->p->n_steps; i++)
        for (int k = 0; k < 2; k++)
            if (tr->steps[i].ev[k]) deft_prefetch_cuda_event_free(L->device[tr->steps[i].lane], tr->steps[i].ev[k]);
    for (int l = 0; l < L->n; l++)
        if (tr->origin[l]) deft_prefetch_cuda_event_free(L->device[l], tr->origin[l]);
    free(tr->steps);
}

/* The lanes are idle first (the origins then mark the trace's start on every stream). */
static deft_status deft_trace_init(deft_trace *tr, deft_program *p) {
    *tr = (deft_trace){.p = p};
    tr->steps = calloc((size_t)(p->n_steps > 0 ? p->n_steps : 1), sizeof *tr->steps);
    if (!tr->steps) return deft_set_error(DEFT_ERR_OOM, "trace: out of host memory");
    const deft_lanes *L = deft_trace_lanes(tr);
    deft_status s = L->n ? deft_lanes_wait_idle(p) : DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < p->n_steps; i++) {
        deft_trace_step *st = &tr->steps[i];
        st->lane = deft_lanes_step_lane(p, p->steps[i]);
        for (int k = 0; s == DEFT_OK && k < 2 && !deft_on_host(tr, st->lane); k++)
            s = deft_trace_event_new(L->device[st->lane], &st->ev[k]);
    }
    for (int l = 0; s == DEFT_OK && l < L->n; l++) {
        s = deft_trace_event_new(L->device[l], &tr->origin[l]);
        if (s == DEFT_OK) s = deft_prefetch_cuda_record(L->device[l], tr->origin[l], L->stream[l]);
    }
    tr->t0 = deft_host_us();
    return s;
}

/* GPU steps' times, once the step has finished. */
static deft_status deft_trace_read(deft_trace *tr) {
    const deft_lanes *L = deft_trace_lanes(tr);
    deft_status s = L->n ? deft_lanes_wait_idle(tr->p) : DEFT_OK;
    for (int i = 0; s == DEFT_OK && i < tr->p->n_steps; i++) {
        deft_trace_step *st = &tr->steps[i];
        if (deft_on_host(tr, st->lane)) continue;
        float b = 0, e = 0;
        s = deft_trace_event_ms(L->device[st->lane], tr->origin[st->lane], st->ev[0], &b);
        if (s == DEFT_OK) s = deft_trace_event_ms(L->device[st->lane], tr->origin[st->lane], st->ev[1], &e);
        st->begin = (double)b * 1e3;
        st->end = (double)e * 1e3;
    }
    return s;
}

/* ---- the file ---- */

/* A JSON string: names are the user's, so quotes, backslashes and control characters are escaped. */
static void deft_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
        else if (*c < 0x20) fprintf(f, "\\u%04x", *c);
        else fputc(*c, f);
    }
    fputc('"', f);
}

/* pid: 0 the host, 1 + n cuda:n. tid: 0 the host, 1 + l lane l. */
static int deft_lane_pid(const deft_trace *tr, int lane) {
    return deft_on_host(tr, lane) ? 0 : 1 + deft_trace_lanes(tr)->device[lane];
}

static int deft_device_pid(deft_device d) { return d.type == DEFT_CPU ? 0 : 1 + d.index; }

static void deft_write_meta(FILE *f, const deft_trace *tr, int lane) {
    const deft_lanes *L = deft_trace_lanes(tr);
    const int pid = deft_lane_pid(tr, lane), tid = deft_on_host(tr, lane) ? 0 : 1 + lane;
    char pname[32], tname[48];
    if (deft_on_host(tr, lane)) {
        snprintf(pname, sizeof pname, "cpu");
        snprintf(tname, sizeof tname, "cpu");
    } else {
        snprintf(pname, sizeof pname, "cuda:%d", L->device[lane]);
        snprintf(tname, sizeof tname, "cuda:%d %s", L->device[lane], L->side && lane == L->side ? "side" : "main");
    }
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n", pid,
            tid, pname);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n", pid, tid,
            tname);
}

static void deft_write_place(FILE *f, const deft_program *p, const deft_tensor *t) {
    deft_node_plan np;
    deft_program_node_plan(p, t, &np);
    switch (np.place) {
    case DEFT_PLACE_ARENA: fprintf(f, "%zu", np.offset); break;
    case DEFT_PLACE_VIEW: fprintf(f, "\"view\""); break;
    case DEFT_PLACE_FUSED: fprintf(f, "\"fused\""); break;
    default: fprintf(f, "\"persistent\""); break;
    }
}

static void deft_write_step(FILE *f, const deft_trace *tr, int i) {
    const deft_program *p = tr->p;
    const deft_trace_step *st = &tr->steps[i];
    const deft_tensor *t = p->graph->nodes[p->steps[i]];
    const double dur = st->end > st->begin ? st->end - st->begin : 0;
    fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":", deft_lane_pid(tr, st->lane),
            deft_on_host(tr, st->lane) ? 0 : 1 + st->lane, st->begin, dur);
    deft_json_str(f, t->name);
    fprintf(f, ",\"cat\":\"%s\",\"args\":{\"step\":%d,\"op\":\"%s\",\"dtype\":\"%s\",\"shape\":[", deft_op_name(t->op),
            i, deft_op_name(t->op), deft_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    fprintf(f, "],\"bytes\":%zu,\"offset\":", deft_tensor_bytes(t));
    deft_write_place(f, p, t);
    const int gi = p->nodes[t->id].group;
    if (gi >= 0) {
        fprintf(f, ",\"members\":[");
        for (int m = 0; m < p->groups[gi].n_members; m++) {
            if (m) fputc(',', f);
            deft_json_str(f, p->graph->nodes[p->groups[gi].members[m]]->name);
        }
        fputc(']', f);
    }
    fprintf(f, "}},\n");
}

/* Arena bytes live (planned buffers whose lifetime holds the step) on each arena's device, as each step begins. */
static void deft_write_counters(FILE *f, const deft_trace *tr, int i) {
    const deft_program *p = tr->p;
    for (int a = 0; a < p->n_arenas; a++) {
        size_t live = 0;
        for (int b = 0; b < p->n_buffers; b++) {
            const deft_buffer *buf = &p->buffers[b];
            if (buf->arena == a && buf->merged_into < 0 && buf->plan.first <= i && i <= buf->plan.last)
                live += buf->plan.size;
        }
        fprintf(f, "{\"ph\":\"C\",\"name\":\"arena bytes\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,"
                "\"args\":{\"live\":%zu}},\n", deft_device_pid(p->arenas[a].device), tr->steps[i].begin, live);
    }
}

static void deft_write_trace(FILE *f, const deft_trace *tr) {
    const deft_program *p = tr->p;
    fprintf(f, "{\"traceEvents\":[\n");
    const deft_lanes *L = deft_trace_lanes(tr);
    int host = 0;
    for (int i = 0; i < p->n_steps; i++) host |= deft_on_host(tr, tr->steps[i].lane);
    for (int a = 0; a < p->n_arenas; a++) host |= p->arenas[a].device.type == DEFT_CPU;
    if (host || !L->n) deft_write_meta(f, tr, L->n);
    for (int l = 0; l < L->n; l++) deft_write_meta(f, tr, l);
    for (int i = 0; i < p->n_steps; i++) {
        deft_write_counters(f, tr, i);
        deft_write_step(f, tr, i);
    }
    /* The last event has no comma after it: a closing metadata event names the trace. */
    fprintf(f, "{\"ph\":\"M\",\"name\":\"trace_steps\",\"pid\":0,\"tid\":0,\"args\":{\"steps\":%d}}\n", p->n_steps);
    fprintf(f, "],\"displayTimeUnit\":\"ms\"}\n");
}

/* ---- the call ---- */

static deft_status deft_trace_one_step(deft_program *p, deft_trace *tr) {
    deft_status s = deft_trace_init(tr, p);
    if (s == DEFT_OK) s = deft_program_run_traced(p, tr);
    if (s == DEFT_OK) s = deft_trace_read(tr);
    return s;
}

deft_status deft_program_trace(deft_program *p, const char *path) {
    if (!p) return deft_set_error(DEFT_ERR_INVALID, "trace: program is NULL");
    if (!path) return deft_set_error(DEFT_ERR_INVALID, "trace: path is NULL");
    if (p->stopped_after)
        return deft_set_error(DEFT_ERR_STATE, "trace: the compile stopped after stage %s (stop_after): the program "
                              "can be printed and dumped, not run", p->stopped_after);
    /* Opened before the step, so that a path that cannot be written costs no step. */
    FILE *f = fopen(path, "w");
    if (!f) return deft_set_error(DEFT_ERR_IO, "trace: cannot write %s", path);
    deft_trace tr;
    deft_status s = deft_trace_one_step(p, &tr);
    if (s == DEFT_OK) deft_write_trace(f, &tr);
    deft_trace_free(&tr);
    const int write_failed = ferror(f) != 0;
    const int close_failed = fclose(f) != 0;
    if (s == DEFT_OK && (write_failed || close_failed))
        s = deft_set_error(DEFT_ERR_IO, "trace: writing %s failed", path);
    if (s != DEFT_OK) remove(path);   /* no file that looks like a trace of a step that failed */
    return s;
}
