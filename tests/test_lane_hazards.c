/* The waits between the streams of a program over several devices (passes/lane_hazards.c), without a GPU: two GPU
 * lanes (0, 1) and the host (2); memory 0 and 1 are the GPUs', 2 the host's. Each case queues steps as
 * runtime/program_lanes.c would and asserts which lanes a step must wait for: a copy waits for what produced its
 * source, a GPU overwriting a range another lane's copy still reads waits for that lane, and nothing else waits
 * (disjoint ranges, reads after reads, lanes already waited for, a GPU's own memory). */
#include <stdint.h>

#include "check.h"
#include "deft_testing.h"

#define HOST 2

static deft_testing_range rd(int mem, uintptr_t lo, uintptr_t hi) { return (deft_testing_range){mem, lo, hi, 0}; }
static deft_testing_range wr(int mem, uintptr_t lo, uintptr_t hi) { return (deft_testing_range){mem, lo, hi, 1}; }

static void queue(deft_testing_hazards *h, int lane, deft_testing_range a, deft_testing_range b) {
    CHECK_OK(deft_testing_hazards_queued(h, lane, (deft_testing_range[]){a, b}, 2));
}

static uint32_t waits2(const deft_testing_hazards *h, int lane, deft_testing_range a, deft_testing_range b) {
    return deft_testing_hazards_waits(h, lane, (deft_testing_range[]){a, b}, 2);
}

/* The record of foreign accesses: its count, its capacity, whether it holds storage. */
static int foreign_of(const deft_testing_hazards *h) { return deft_testing_hazards_foreign(h, NULL, NULL); }
static int cap_of(const deft_testing_hazards *h) {
    int cap = -1;
    deft_testing_hazards_foreign(h, &cap, NULL);
    return cap;
}
static int stored_of(const deft_testing_hazards *h) {
    int stored = -1;
    deft_testing_hazards_foreign(h, NULL, &stored);
    return stored;
}

static uint32_t waits1(const deft_testing_hazards *h, int lane, deft_testing_range a) {
    return deft_testing_hazards_waits(h, lane, &a, 1);
}

static uint32_t waits_upto(const deft_testing_hazards *h, int lane, const deft_testing_range *r, int nr,
                           int64_t *upto) {
    return deft_testing_hazards_waits_upto(h, lane, r, nr, upto);
}

/* cuda:0 computes x, cuda:1 copies it (on its own lane), then cuda:0 goes on. */
static void test_peer_copy(void) {
    deft_testing_hazards *h = deft_testing_hazards_new(2);
    queue(h, 0, rd(0, 0, 100), wr(0, 100, 200));             /* x = f(input) on cuda:0 */
    CHECK(waits2(h, 1, rd(0, 100, 200), wr(1, 0, 100)) == 1u); /* the copy waits for cuda:0 */
    deft_testing_hazards_waited(h, 1, 0);
    CHECK(waits2(h, 1, rd(0, 100, 200), wr(1, 0, 100)) == 0u); /* and only once */
    queue(h, 1, rd(0, 100, 200), wr(1, 0, 100));
    CHECK(foreign_of(h) == 1);                                    /* its read of cuda:0's memory is kept */
    queue(h, 1, rd(1, 0, 100), wr(1, 100, 200));               /* cuda:1 computes on its own memory */

    CHECK(waits1(h, 0, wr(0, 200, 300)) == 0u);                /* cuda:0 writes elsewhere: no wait */
    CHECK(waits1(h, 0, rd(0, 100, 200)) == 0u);                /* reads what the copy reads: no wait */
    CHECK(waits1(h, 0, wr(0, 150, 250)) == 2u);                /* overwrites it: waits for cuda:1 */
    CHECK(waits1(h, 0, wr(0, 0, UINTPTR_MAX)) == 2u);          /* so does an optimizer (all of its memory) */
    CHECK(waits1(h, 0, wr(0, 200, 300)) == 0u);
    deft_testing_hazards_waited(h, 0, 1);
    CHECK(waits1(h, 0, wr(0, 150, 250)) == 0u);                /* waited for: the copy is done */
    queue(h, 1, rd(1, 100, 200), wr(1, 0, 100));               /* more on cuda:1, its own memory only */
    CHECK(waits1(h, 0, wr(0, 150, 250)) == 0u);

    /* Copying back: the copy (on cuda:0's lane) waits for cuda:1's last step on its memory, even for a range that
     * step did not touch (the owner's steps are counted, not kept one by one). */
    CHECK(waits2(h, 0, rd(1, 300, 400), wr(0, 400, 500)) == 2u);
    deft_testing_hazards_reset(h, 2);
    CHECK(foreign_of(h) == 0 && waits1(h, 0, wr(0, 150, 250)) == 0u);
    deft_testing_hazards_delete(h);
}

/* Copies between the GPUs and the host, and a step on the host between them. */
static void test_host_memory(void) {
    deft_testing_hazards *h = deft_testing_hazards_new(2);
    queue(h, 0, rd(0, 0, 64), wr(HOST, 0, 64));                   /* cuda:0 -> cpu */
    CHECK(waits1(h, HOST, rd(HOST, 64, 128)) == 0u);               /* the host reads other bytes: no wait */
    CHECK(waits2(h, HOST, rd(HOST, 0, 64), wr(HOST, 64, 128)) == 1u); /* reads the copy's: waits for cuda:0 */
    deft_testing_hazards_waited(h, HOST, 0);
    CHECK(waits2(h, HOST, rd(HOST, 0, 64), wr(HOST, 64, 128)) == 0u);
    /* the host's step itself leaves nothing to wait for */
    CHECK_OK(deft_testing_hazards_queued(h, HOST, (deft_testing_range[]){rd(HOST, 0, 64), wr(HOST, 64, 128)}, 2));
    CHECK(foreign_of(h) == 1);
    queue(h, 1, rd(HOST, 64, 128), wr(1, 0, 64));                  /* cpu -> cuda:1 */
    CHECK(waits1(h, HOST, wr(HOST, 64, 128)) == 2u);               /* the host overwrites it: waits for cuda:1 */
    CHECK(waits1(h, HOST, rd(HOST, 64, 128)) == 0u);               /* a read does not */
    CHECK(waits2(h, 0, rd(0, 0, 64), wr(HOST, 100, 200)) == 2u);   /* nor does a GPU's write elsewhere: */
    CHECK(waits2(h, 0, rd(0, 0, 64), wr(HOST, 200, 300)) == 0u);   /* only where it overlaps */
    deft_testing_hazards_delete(h);
}

/* The record of foreign accesses grows past its first size and is kept across runs. */
static void test_many_copies(void) {
    deft_testing_hazards *h = deft_testing_hazards_new(2);
    for (uintptr_t i = 0; i < 100; i++) queue(h, 1, rd(0, 10 * i, 10 * i + 10), wr(1, 10 * i, 10 * i + 10));
    CHECK(foreign_of(h) == 100 && cap_of(h) >= 100);
    CHECK(waits1(h, 0, wr(0, 995, 996)) == 2u);
    CHECK(waits1(h, 0, wr(0, 1000, 2000)) == 0u);
    deft_testing_hazards_reset(h, 2);
    CHECK(foreign_of(h) == 0 && cap_of(h) >= 100 && stored_of(h));
    deft_testing_hazards_free(h);
    CHECK(!stored_of(h) && cap_of(h) == 0);
    deft_testing_hazards_delete(h);
}

/* A side lane on lane 0's GPU (memory 0 is lane 0's): lane 1 reads and writes lane 0's memory step by step, and
 * lane 0 waits only through the side step whose access it conflicts with (each side step records an event). */
static void test_wait_upto(void) {
    deft_testing_hazards *h = deft_testing_hazards_new(2);
    queue(h, 0, rd(0, 0, 100), wr(0, 100, 200));
    int64_t upto[2];
    CHECK(waits_upto(h, 1, (deft_testing_range[]){rd(0, 100, 200)}, 1, upto) == 1u && upto[0] == 1);
    deft_testing_hazards_waited(h, 1, 0);
    queue(h, 1, rd(0, 100, 200), wr(0, 1000, 1100));   /* side step 1 */
    queue(h, 1, rd(0, 0, 100), wr(0, 1100, 1200));     /* side step 2 */
    queue(h, 1, rd(0, 300, 400), wr(0, 1200, 1300));   /* side step 3 */
    CHECK(waits_upto(h, 0, (deft_testing_range[]){wr(0, 0, 50)}, 1, upto) == 2u && upto[1] == 2);
    CHECK(waits_upto(h, 0, (deft_testing_range[]){rd(0, 1000, 1100), wr(0, 50, 60)}, 2, upto) == 2u &&
          upto[1] == 2);
    deft_testing_hazards_waited_upto(h, 0, 1, 2);
    CHECK(waits1(h, 0, rd(0, 1000, 1100)) == 0u);       /* step 1's write is covered */
    CHECK(waits1(h, 0, wr(0, 0, 100)) == 0u);           /* and step 2's read */
    CHECK(waits_upto(h, 0, (deft_testing_range[]){rd(0, 1250, 1260)}, 1, upto) == 2u && upto[1] == 3);
    deft_testing_hazards_waited_upto(h, 0, 1, 1);               /* an older wait changes nothing */
    CHECK(deft_testing_hazards_seen(h, 0, 1) == 2);
    deft_testing_hazards_delete(h);
}

int main(void) {
    test_wait_upto();
    test_peer_copy();
    test_host_memory();
    test_many_copies();
    return deft_check_finish();
}
