/* Parameter records, as parameter files (data/param_file.c) and training-state files (data/train_state.c) hold them:
 * per parameter, u32 name length, the name, u32 dtype, u32 ndim, ndim x i64 dims, u64 data bytes, u32 CRC-32 of that
 * header (absent in version 1 parameter files), the data (little-endian elements), u32 CRC-32 of the data. */
#ifndef DEFT_PARAM_RECORDS_H
#define DEFT_PARAM_RECORDS_H

#include "file_format.h"
#include "graph_internal.h"

/* The graph's parameters in build order (the order a file is written in), checked to have unique, non-empty names
 * (records are matched by name). `who` and `path` name the caller in messages. */
deft_status deft_params_collect(const deft_graph *g, const char *who, const char *path, deft_tensor ***out,
                                int *n_out);

/* Writes the record of each parameter, its value read from wherever it lives. */
deft_status deft_param_records_write(deft_file_writer *w, deft_tensor *const *params, int n);

/* Reads `count` records into staged[i] (host order, one malloc'd buffer per parameter of `params` it matched, sized
 * from the graph). A corrupt or truncated record is DEFT_ERR_IO; an intact one of another model (a name the graph
 * lacks, another dtype or shape) DEFT_ERR_INVALID naming it. head_crc: the records' headers carry a CRC (every format
 * but version 1 parameter files). */
deft_status deft_param_records_read(deft_file_reader *r, uint64_t count, bool head_crc, deft_tensor *const *params,
                                    int n, void **staged);
/* DEFT_ERR_INVALID naming the first parameter of the graph that no record matched (the file is of another model). */
deft_status deft_param_records_complete(const deft_file_reader *r, deft_tensor *const *params, int n,
                                        void *const *staged);

/* Sets every parameter from its staged value. */
deft_status deft_param_records_apply(const char *who, const char *path, deft_tensor *const *params, int n,
                                     void *const *staged);

#endif
