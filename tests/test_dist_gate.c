/* The gate deft_dist_run's replicas pass around each collective (dist/dist_gate.c), with threads standing for the
 * replicas (deft_testing_gate):
 * - 4 threads, 200 passes: every thread gets through all of them, and no passage opens before every thread has
 *   arrived (a thread's wait on its device then covers only collectives every GPU has queued);
 * - a replica whose run fails leaves the gate: the others go on through every pass, each passage then waiting for
 *   the three still in the run;
 * - a replica that neither arrives nor leaves: the others fail at that pass after the deadline, with
 *   DEFT_ERR_RUNTIME and a message naming their rank and the deadline, not a hang;
 * - one thread alone (no peers) passes at once. */
#include <string.h>

#include "check.h"
#include "deft_testing.h"

static void all_passed(void) {
    deft_testing_gate_result r;
    CHECK(deft_testing_gate(&(deft_testing_gate_case){4, 200, -1, 0, 0, 30.0}, &r) == 0);
    CHECK(r.early_passes == 0);
    for (int i = 0; i < 4; i++) CHECK(r.status[i] == DEFT_OK && r.passed[i] == 200);
}

static void one_leaves(void) {
    deft_testing_gate_result r;
    CHECK(deft_testing_gate(&(deft_testing_gate_case){4, 100, 2, 10, 0, 30.0}, &r) == 0);
    CHECK(r.early_passes == 0);
    CHECK(r.passed[2] == 10 && r.status[2] == DEFT_OK);
    for (int i = 0; i < 4; i++)
        if (i != 2) CHECK_MSG(r.status[i] == DEFT_OK && r.passed[i] == 100, "thread %d: %d passes", i, r.passed[i]);
}

static void one_stuck(void) {
    deft_testing_gate_result r;
    CHECK(deft_testing_gate(&(deft_testing_gate_case){3, 20, 1, 5, 1, 0.2}, &r) == 0);
    for (int i = 0; i < 3; i += 2) {
        CHECK(r.status[i] == DEFT_ERR_RUNTIME);
        CHECK_MSG(r.passed[i] == 5, "thread %d: %d passes", i, r.passed[i]);
        char rank[32];
        snprintf(rank, sizeof rank, "rank %d waited more than 0.2 s", i);
        CHECK_MSG(strstr(r.message[i], rank) != NULL, "%s", r.message[i]);
        CHECK(strstr(r.message[i], "test collective") != NULL);
    }
    CHECK(r.status[1] == DEFT_OK && r.passed[1] == 5);
}

static void alone(void) {
    deft_testing_gate_result r;
    CHECK(deft_testing_gate(&(deft_testing_gate_case){1, 50, -1, 0, 0, 0.01}, &r) == 0);
    CHECK(r.status[0] == DEFT_OK && r.passed[0] == 50);
    CHECK(deft_testing_gate(&(deft_testing_gate_case){17, 5, -1, 0, 0, 1.0}, &r) == -1);
    CHECK(deft_testing_gate(&(deft_testing_gate_case){2, 257, -1, 0, 0, 1.0}, &r) == -1);
}

int main(void) {
    all_passed();
    one_leaves();
    one_stuck();
    alone();
    return deft_check_finish();
}
