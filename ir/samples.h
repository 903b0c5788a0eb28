/* One-op sample graphs: for every op of ops.def, a random instance in a given dtype (odd
 * sizes, size-1 and broadcast dimensions, sizes that are not multiples of the vector width),
 * with the input domain where the op is defined and the tolerance within which the JIT
 * matches the reference interpreter. The conformance test runs them through both; `loom-ir
 * ops` asks each layer (interpreter, codegen, autograd) what it does with them, so what it
 * reports comes from the layers themselves and cannot go stale. */
#ifndef LOOM_IR_SAMPLES_H
#define LOOM_IR_SAMPLES_H

#include "ir/ir.h"

/* The dtypes an op may be sampled in, in the order tables list them. */
#define LOOM_IR_SAMPLE_N_DTYPES 7
extern const loom_dtype loom_ir_sample_dtypes[LOOM_IR_SAMPLE_N_DTYPES];

/* Whether op takes dtype dt (for casts, generators and collectives: produces it). */
bool loom_ir_op_accepts(loom_ir_op op, loom_dtype dt);

/* The xorshift64 generator the samples draw from; *state must not be 0. */
uint64_t loom_ir_sample_next(uint64_t *state);

typedef struct loom_ir_sample {
    int32_t subject;         /* the sampled op's node (other nodes feed it or read it) */
    double lo, hi;           /* input values where the op is defined (integers: whole numbers) */
    double rel_tol, abs_tol; /* |jit - interp| <= abs_tol + rel_tol * |interp| */
} loom_ir_sample;

/* Builds into g (empty) a random instance of op in dtype dt (loom_ir_op_accepts must hold):
 * its graph inputs, the op, and one output; some cases add a consumer or a second output so
 * that the op is also fused into a kernel. Extents are drawn from {1, 2, 3, 5, 7, 8, 16, 17,
 * 31, 33, 64, 100} (small: the first six) at ranks 0..4. *rng advances.
 * Errors: INVALID_ARGUMENT (dt not accepted), OUT_OF_MEMORY, in d. */
loom_status loom_ir_sample_build(loom_ir_graph *g, loom_ir_op op, loom_dtype dt, bool small,
                                 uint64_t *rng, loom_ir_sample *out, loom_ir_diag *d);

/* Fills n elements of dtype dt at buf with values from [lo, hi) (integers: whole numbers in
 * [lo, hi]; bools: 0 or 1). *rng advances. */
void loom_ir_sample_fill(void *buf, loom_dtype dt, int64_t n, double lo, double hi, uint64_t *rng);

#endif
