/* Graphviz DOT dump: one node per op with its shape, dtype and device; with a program, where each value lives. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "autocast.h"
#include "graph_internal.h"
#include "graph_hooks.h"

/* Fill colours by device: the CPU grey-blue, each GPU its own hue. */
static const char *deft_device_colour(deft_device d) {
    static const char *gpu[] = {"#b7e4c7", "#ffd6a5", "#caffbf", "#fdffb6", "#ffadad", "#bdb2ff", "#a0c4ff",
                                "#ffc6ff"};
    return d.type == DEFT_CPU ? "#dbe4f0" : gpu[(unsigned)d.index % 8];
}

static const char *deft_node_shape(const deft_tensor *t) {
    if (t->autocast == DEFT_AUTOCAST_CAST) return "hexagon";
    switch (t->op) {
    case DEFT_OP_INPUT: return "invhouse";
    case DEFT_OP_PARAM: return "cylinder";
    case DEFT_OP_CONSTANT: return "note";
    default: return "box";
    }
}

static void deft_dot_plan_line(FILE *f, const deft_graph *g, const deft_program *p, const deft_tensor *t, bool *dead,
                               bool *output) {
    deft_node_plan np;
    *dead = false;
    *output = false;
    if (!p) return;
    g->hooks->node_plan(p, t, &np);
    *output = np.is_output;
    switch (np.place) {
    case DEFT_PLACE_NONE: *dead = true; fprintf(f, "\\nnot computed"); break;
    case DEFT_PLACE_PERSISTENT: fprintf(f, "\\npersistent %zu B", np.size); break;
    case DEFT_PLACE_ARENA:
        fprintf(f, "\\narena @%zu, %zu B\\nlive %d..%d", np.offset, np.size, np.first, np.last);
        break;
    case DEFT_PLACE_VIEW: fprintf(f, "\\nview @%zu, %zu B", np.offset, np.size); break;
    case DEFT_PLACE_FUSED: fprintf(f, "\\nin fused kernel %d (not stored)", np.group); break;
    }
    if (np.group >= 0 && np.place != DEFT_PLACE_FUSED) fprintf(f, "\\nfused kernel %d", np.group);
    if (np.dropped) fprintf(f, "\\ndropped after the forward pass");
    if (np.recompute) fprintf(f, "\\nrecomputed for the backward pass");
    if (np.side) fprintf(f, "\\nside stream");
}

/* Checkpointing's copies belong to one program: drawn with it only, the recomputations in red. */
static bool deft_dot_hidden(const deft_program *p, const deft_tensor *t) {
    return t->ckpt_role != DEFT_CKPT_USER && (!p || t->ckpt_owner != p);
}

deft_status deft_graph_dump_dot(const deft_graph *g, const deft_program *p, const char *path) {
    if (!g || !path) return deft_set_error(DEFT_ERR_INVALID, "dump_dot: graph or path is NULL");
    if (p && !deft_graph_owns_program(g, p))
        return deft_set_error(DEFT_ERR_INVALID, "dump_dot: the program was not compiled from this graph");
    FILE *f = fopen(path, "w");
    if (!f) return deft_set_error(DEFT_ERR_IO, "dump_dot: cannot open %s for writing: %s", path, strerror(errno));
    fprintf(f, "digraph deft {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n");
    for (int i = 0; i < g->n_nodes; i++) {
        const deft_tensor *t = g->nodes[i];
        if (deft_dot_hidden(p, t)) continue;
        char shape[160], dev[32];
        bool dead, output;
        fprintf(f, "  n%d [shape=%s, fillcolor=\"%s\", label=\"%s\\n%s %s %s %s", t->id, deft_node_shape(t),
                deft_device_colour(t->device), t->name, deft_op_name(t->op), deft_dtype_name(t->dtype),
                deft_shape_str(t->ndim, t->shape, shape, sizeof shape), deft_device_str(t->device, dev, sizeof dev));
        /* Casts the autocast rewrite inserted (ir/autocast.h): labelled and drawn apart from the user's nodes. */
        const bool cast = t->autocast == DEFT_AUTOCAST_CAST;
        if (cast) fprintf(f, "\\nautocast");
        deft_dot_plan_line(f, g, p, t, &dead, &output);
        fprintf(f, "\"%s%s%s%s];\n", cast ? ", color=\"#e85d04\", penwidth=2" : "",
                dead ? ", style=\"filled,dashed\", fontcolor=gray50" : "", output ? ", peripheries=2, penwidth=2" : "",
                t->ckpt_role == DEFT_CKPT_RECOMPUTE ? ", color=\"#c1121f\", fontcolor=\"#c1121f\", penwidth=2.5" : "");
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const deft_tensor *t = g->nodes[i];
        if (deft_dot_hidden(p, t)) continue;
        for (int k = 0; k < t->nsrc; k++)
            fprintf(f, "  n%d -> n%d%s;\n", t->src[k]->id, t->id,
                    t->is_view ? " [style=dashed]" : t->src[k]->ckpt_role == DEFT_CKPT_RECOMPUTE ? " [color=\"#c1121f\"]" : "");
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0) return deft_set_error(DEFT_ERR_IO, "dump_dot: writing %s failed", path);
    return DEFT_OK;
}
