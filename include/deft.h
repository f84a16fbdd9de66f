/* deft: deferred tensor computation in C.
 *
 * Building a graph runs nothing. A graph is compiled into a program for the outputs it is asked for (only the nodes
 * those outputs need are scheduled), planned into one arena per device, and run on request.
 *
 * Errors: builders return NULL on error and accept NULL inputs (so a chain is checked once at its end); every other
 * call returns a deft_status. deft_errmsg() gives the last message of the calling thread; a graph also remembers its
 * first error (deft_graph_error). Nothing in the library aborts or exits on bad input.
 */
#ifndef DEFT_H
#define DEFT_H

/* The API by concern; this header is the one to include. */
#include "deft/core.h"
#include "deft/compile.h"
#include "deft/train.h"
#include "deft/memory.h"
#include "deft/data.h"
#include "deft/dist.h"

#endif
