/* The DOT dump: every node with its name, op, dtype, shape and device; after compiling, where it lives; and the
 * file renders with Graphviz. */
#include <stdlib.h>

#include "check.h"
#include "read_file.h"

int main(void) {
    deft_graph *g = deft_graph_new();
    deft_tensor *x = deft_input(g, "x", DEFT_F32, 2, (int64_t[]){8, 4}, deft_cpu());
    deft_tensor *w = deft_param(g, "w", DEFT_F32, 2, (int64_t[]){4, 3}, deft_cpu(), DEFT_INIT_KAIMING);
    deft_tensor *k = deft_constant(g, DEFT_F32, 1, (int64_t[]){3}, deft_cpu(), (float[]){1, 2, 3}, 12);
    deft_tensor *y = deft_set_name(deft_relu(deft_add(deft_matmul(x, w), k)), "y");
    deft_tensor *flat = deft_set_name(deft_reshape(y, 1, (int64_t[]){24}), "flat");
    deft_tensor *dead = deft_set_name(deft_exp(y), "dead");
    CHECK(flat && dead);

    CHECK_OK(deft_graph_dump_dot(g, NULL, "test_dot_graph.dot"));
    char *s = read_file("test_dot_graph.dot");
    CHECK(s != NULL);
    if (s) {
        CHECK(strstr(s, "digraph deft") != NULL);
        CHECK(strstr(s, "x\\ninput f32 [8, 4] cpu") != NULL);
        CHECK(strstr(s, "w\\nparam f32 [4, 3] cpu") != NULL);
        CHECK(strstr(s, "shape=invhouse") != NULL);   /* inputs */
        CHECK(strstr(s, "shape=cylinder") != NULL);   /* parameters */
        CHECK(strstr(s, "shape=note") != NULL);       /* constants */
        CHECK(strstr(s, "arena @") == NULL);          /* nothing planned yet */
    }
    free(s);

    deft_program *p = deft_compile(g, &flat, 1, NULL);
    CHECK(p != NULL);
    CHECK_OK(deft_graph_dump_dot(g, p, "test_dot_plan.dot"));
    s = read_file("test_dot_plan.dot");
    CHECK(s != NULL);
    if (s) {
        CHECK(strstr(s, "y\\nrelu f32 [8, 3] cpu\\narena @") != NULL);
        CHECK(strstr(s, "flat\\nreshape f32 [24] cpu\\nview @") != NULL);
        CHECK(strstr(s, "dead\\nexp f32 [8, 3] cpu\\nnot computed") != NULL);
        CHECK(strstr(s, "peripheries=2") != NULL);    /* the output */
        CHECK(strstr(s, "persistent 48 B") != NULL);  /* w: 4 x 3 floats */
    }
    free(s);
    CHECK_ERR(deft_graph_dump_dot(g, p, "/nonexistent-dir/x.dot"), DEFT_ERR_IO, "cannot open /nonexistent-dir/x.dot");
    /* A program of another graph describes none of this one's nodes: refused, nothing written. */
    deft_graph *other = deft_graph_new();
    CHECK(deft_input(other, "z", DEFT_F32, 1, (int64_t[]){2}, deft_cpu()) != NULL);
    remove("test_dot_other.dot");
    CHECK_ERR(deft_graph_dump_dot(other, p, "test_dot_other.dot"), DEFT_ERR_INVALID, "not compiled from this graph");
    CHECK(read_file("test_dot_other.dot") == NULL);
    deft_graph_free(other);

    if (system("command -v dot > /dev/null 2>&1") != 0) {
        printf("Graphviz 'dot' is not installed: the rendering check is skipped\n");
        deft_graph_free(g);
        return deft_check_failures ? 1 : 77;
    }
    CHECK(system("dot -Tsvg test_dot_plan.dot -o test_dot_plan.svg") == 0);
    s = read_file("test_dot_plan.svg");
    CHECK(s && strstr(s, "<svg") != NULL);
    free(s);
    deft_graph_free(g);
    return deft_check_finish();
}
