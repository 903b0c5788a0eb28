/* Execution plans: a graph partitioned into kernels (what fusion produces) and its values
 * placed in buffers (what memory planning produces). Passes write plans, codegen compiles
 * them, the runtime runs them. Lives in ir/ because every layer above reads it. */
#ifndef LOOM_IR_PLAN_H
#define LOOM_IR_PLAN_H

#include "ir.h"

typedef enum loom_ir_kernel_kind {
    /* one loop nest over the root's shape: elementwise ops, broadcasts, transposes and
     * constants, all fused; the root is the last elementwise/movement node */
    LOOM_IR_KERNEL_ELEMENTWISE,
    /* a reduction (root) with its elementwise prologue (the chain feeding it) and its
     * elementwise epilogue (ops applied to the reduced value, e.g. mean's scale, sqrt) */
    LOOM_IR_KERNEL_REDUCTION,
    /* a matmul (root) with an elementwise epilogue (bias, activation, cast) */
    LOOM_IR_KERNEL_MATMUL,
    LOOM_IR_KERNEL_COUNT_
} loom_ir_kernel_kind;

typedef struct loom_ir_kernel {
    loom_ir_kernel_kind kind;
    int32_t root;      /* the node whose iteration space the kernel loops over */
    int32_t n_nodes;   /* nodes computed inside the kernel, in graph order */
    int32_t *nodes;
    int32_t n_args;    /* nodes whose values the kernel reads from buffers */
    int32_t *args;
    int32_t n_results; /* nodes whose values the kernel writes to buffers */
    int32_t *results;
} loom_ir_kernel;

typedef enum loom_ir_buffer_kind {
    LOOM_IR_BUFFER_INPUT,  /* graph input `index` (the caller's buffer) */
    LOOM_IR_BUFFER_OUTPUT, /* graph output `index` (the caller's buffer; may alias an input) */
    LOOM_IR_BUFFER_ARENA,  /* `offset` bytes into the step's scratch arena */
    LOOM_IR_BUFFER_COUNT_
} loom_ir_buffer_kind;

/* Where a materialized value lives. A reshape's value shares its operand's placement. */
typedef struct loom_ir_placement {
    loom_ir_buffer_kind kind;
    int32_t index;  /* INPUT / OUTPUT */
    size_t offset;  /* ARENA, 64-byte aligned */
    size_t bytes;
} loom_ir_placement;

typedef struct loom_ir_plan {
    loom_allocator alloc;
    loom_ir_arena arena; /* kernels' node/arg/result arrays */
    loom_ir_kernel *kernels; /* in execution order */
    int32_t n_kernels, cap_kernels;
    /* per graph node: its kernel (-1 for inputs, and for reshapes and constants that are
     * folded into their users), and its placement when materialized (has_placement) */
    int32_t *node_kernel;
    loom_ir_placement *placement;
    bool *has_placement;
    int32_t n_nodes;
    size_t arena_bytes;  /* scratch arena size */
    size_t peak_bytes;   /* planned peak: arena + outputs not aliasing inputs */
} loom_ir_plan;

void loom_ir_plan_init(loom_ir_plan *p, const loom_allocator *a);
void loom_ir_plan_deinit(loom_ir_plan *p);

#endif
