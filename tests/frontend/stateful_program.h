/* Random stateful programs, for differential checks of compiled steps that run many times:
 * a few long-lived f32 state tensors, updated in place by loom_assign in every step (buffer
 * donation), read through reshapes and transposes, read again after their update (the new
 * value) and through views taken before it (the old one), some results retained as outputs,
 * sometimes read in the middle of a step (a partial compute). The same program is played on
 * a compiled context and on the reference interpreter, step after step, and every state
 * tensor and output is compared after every step (tests/frontend/test_stateful.c, with fixed
 * seeds; fuzz/fuzz_stateful.c, from libFuzzer's bytes). Every op is continuous (no compare
 * feeds a select that could flip), so a difference beyond rounding is a bug, not chaos. */
#ifndef LOOM_TESTS_STATEFUL_PROGRAM_H
#define LOOM_TESTS_STATEFUL_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

enum { SP_MAX_STATE = 4, SP_MAX_INSTR = 40, SP_MAX_VALUES = 96, SP_MAX_OUTPUTS = 8 };

/* Where a program's choices come from: bytes while they last, then a generator seeded by
 * them (or by a seed). */
typedef struct sp_source {
    const uint8_t *bytes;
    size_t n, pos;
    uint64_t s;
} sp_source;

void sp_source_from_seed(sp_source *src, uint64_t seed);
void sp_source_from_bytes(sp_source *src, const uint8_t *bytes, size_t n);

typedef enum sp_kind {
    SP_INPUT,     /* a new per-step input (host data that depends on the step) */
    SP_UNARY,     /* neg, tanh, sigmoid, relu, abs, scale by 0.5 or 1.5 */
    SP_BINARY,    /* add, sub, mul, maximum, minimum of two values of one shape */
    SP_SCALAR,    /* a value and a rank-0 constant */
    SP_RESHAPE,   /* flatten, or unflatten to [a, b] */
    SP_TRANSPOSE, /* rank 2 */
    SP_REDUCE,    /* sum over one axis, kept, broadcast back */
    SP_MATMUL,    /* v x transpose(v) */
    SP_ASSIGN,    /* state[k] := tanh(v) (v reshaped to state k's shape) */
    SP_RETAIN,    /* v is an output of the step */
    SP_READ,      /* loom_tensor_read(v) in the middle of the step */
    SP_KIND_COUNT_
} sp_kind;

typedef struct sp_instr {
    sp_kind kind;
    int32_t a, b; /* operand values */
    int32_t k;    /* ASSIGN: the state tensor */
    int32_t sub;  /* which op of the kind; RESHAPE: the new rank's split */
} sp_instr;

typedef struct sp_shape {
    int32_t rank;
    int64_t d[2];
} sp_shape;

typedef struct sp_program {
    int32_t n_state;
    sp_shape state[SP_MAX_STATE];
    int32_t n_instr;
    sp_instr instr[SP_MAX_INSTR];
    /* value i's shape; values 0..n_state-1 are the state tensors as the step begins, each
     * instruction that makes a value appends one (an ASSIGN appends state k's new value) */
    int32_t n_values;
    sp_shape shape[SP_MAX_VALUES];
} sp_program;

void sp_generate(sp_program *p, sp_source *src);
/* The program as text, one instruction a line (for a failure's message). */
void sp_print(const sp_program *p, char *buf, size_t size);

/* One context playing a program: its state tensors and the last step's outputs. */
typedef struct sp_run {
    loom_context *ctx;
    loom_tensor *state[SP_MAX_STATE];
    int32_t n_out;
    loom_tensor *out[SP_MAX_OUTPUTS];
} sp_run;

/* A context (eager: the reference interpreter; cache_dir "" (none); poison: LOOM_POISON's
 * filled memory) with the state tensors created from fixed values. Returns LOOM_OK or the
 * failure's status. */
loom_status sp_run_init(sp_run *r, const sp_program *p, bool eager, bool poison);
void sp_run_deinit(sp_run *r);
/* Records step `step` of p and marks it; the retained outputs replace the last step's.
 * Returns LOOM_OK or the context's error. */
loom_status sp_run_step(sp_run *r, const sp_program *p, int64_t step);

/* Compares every state tensor and output of got with want's (an element may differ by
 * 1e-4 (1 + |want|)); on a difference writes what differed to msg and returns false. */
bool sp_compare(sp_run *got, sp_run *want, const sp_program *p, char *msg, size_t size);

#endif
