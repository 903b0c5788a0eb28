/* The host side of the collective IR ops (ops.def kind COLLECTIVE), shared by the reference
 * interpreter and compiled programs: running one through the world communicator (the self
 * rules when loom_dist_init was never called: one rank), the error that names the node and
 * the user's source line, and the check that every rank is about to run the same
 * collectives. */
#ifndef LOOM_RUNTIME_COLLECTIVE_H
#define LOOM_RUNTIME_COLLECTIVE_H

#include "comm.h"

/* The error of collective node i of g: "file.c:12: %4 = all_reduce of f32[2]: msg". */
loom_status loom_rt_collective_error(const loom_ir_graph *g, int32_t i, loom_status st,
                                     const char *msg, loom_ir_diag *d);

/* Runs collective node i of g from src (its operand's value) into dst (its own), blocking.
 * Errors (named by loom_rt_collective_error): COMM_ERROR, INVALID_ARGUMENT (a root or a
 * world size the graph was traced for that this world does not have), OUT_OF_MEMORY. */
loom_status loom_rt_collective_run(const loom_ir_graph *g, int32_t i, const void *src, void *dst,
                                   loom_ir_diag *d);

/* Starts the all-reduce of count elements of buf (in place) with the op, dtype and scale of
 * ALL_REDUCE node i of g: the node's own value, or a bucket of several all-reduces that
 * share those attributes laid end to end. prescaled: buf already holds scale * x (a sum
 * whose scale the caller applied while copying its operands in), so the scale is not
 * applied again. *out_req must then go to loom_rt_comm_wait; it is NULL when there is no
 * communicator (one rank: the scale is applied here, at once). Errors: as
 * loom_rt_collective_run. */
loom_status loom_rt_collective_allreduce_start(const loom_ir_graph *g, int32_t i, void *buf,
                                               size_t count, bool prescaled,
                                               loom_rt_comm_request **out_req, loom_ir_diag *d);

/* Adds one collective to a digest of a step's collectives (h starts at 0): node n's op and
 * attributes moving count elements. A bucket adds its first member with the bucket's
 * count, so a bucket of one is the same collective as the node run alone. */
uint64_t loom_rt_collective_digest(uint64_t h, const loom_ir_node *n, size_t count);

/* The digest the ranks compare before a step's first collective: its collectives' digest
 * with the structural hash of the step's graph as traced (step; NULL: collectives only), so
 * ranks that recorded different steps (another batch size or amp mode) fail at once instead
 * of training apart or hanging. */
uint64_t loom_rt_step_digest(uint64_t coll_digest, const loom_ir_graph *step);

/* With several ranks, checks that every rank's step is about to run the same collectives
 * in the same graph: one all-reduce (max) of the digest (loom_rt_step_digest) and its
 * negation, which agree when max == min. n is the number of collectives digested and first
 * the node of the first, for the message. When they differ, the ranks find the first node
 * where their step graphs differ (a binary search over loom_ir_graph_prefix_hashes, in
 * lockstep) and every rank's message names it as this rank, rank 0 and another rank have
 * it. A rank whose step has no collective never joins: the others fail at the
 * communicator's timeout. No-op with one rank or n == 0. Errors: COMM_ERROR naming first. */
loom_status loom_rt_collectives_agree(const loom_ir_graph *g, int32_t first, int32_t n,
                                      uint64_t digest, const loom_ir_graph *step,
                                      loom_ir_diag *d);

#endif
