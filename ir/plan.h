/* Execution plans: a graph partitioned into kernels (what fusion produces) and its values
 * placed in buffers (what memory planning produces). Passes write plans, codegen compiles
 * their kernels, the runtime runs them. Lives in ir/ because every layer above reads it.
 *
 * Rules a valid plan obeys (loom_ir_plan_verify checks them):
 *  - Every node that is not an INPUT, a CONSTANT or a RESHAPE belongs to exactly one kernel
 *    (node_kernel[i] >= 0). CONSTANTs belong to no kernel: each kernel that uses one lists
 *    it in its nodes and recomputes it (a fill is free). A RESHAPE belongs to no kernel
 *    either: its value is its operand's bytes, so it shares its operand's placement; a
 *    kernel that reads it lists the RESHAPE node itself as the arg (with its shape).
 *    (The fold pass turns a reshape of a constant into a constant.)
 *  - A kernel's `nodes` are in graph order and include its root and any constants it uses.
 *    Its `args` are the values it reads from buffers: INPUT nodes, results of earlier
 *    kernels, or RESHAPEs of those (a matmul's operands are args, except casts and
 *    transposes feeding a 16-bit matmul, large transposes feeding an f32 one:
 *    loom_ir_matmul_operand_fuses). Its `results` are
 *    the nodes it computes whose values are used outside it (by later kernels, or as graph
 *    outputs). Kernels are in an order where every arg is available before its reader runs.
 *  - Every materialized value (kernel results, INPUT nodes; RESHAPEs through their
 *    operand) has a placement. A graph output whose node a kernel computes is placed in
 *    that OUTPUT buffer, unless the output aliases a graph input (donation) or the node is
 *    already placed for another output: then it lives in the arena or its first output and
 *    a copy moves it after all kernels have run (`copies`). Outputs that are INPUT nodes or
 *    RESHAPEs of other placed values are also copies. A graph output that is a CONSTANT
 *    gets a kernel of its own (ELEMENTWISE with the constant as root).
 *  - ARENA placements of values whose lifetimes overlap never overlap in bytes.
 *  - In-place donation: an output aliasing a graph input is placed straight in its OUTPUT
 *    buffer (the caller passes the donated input's buffer for it) only when
 *    loom_ir_plan_can_update_in_place says every read of that input happens at the
 *    element being written; otherwise it goes through the arena and a copy.
 */
#ifndef LOOM_IR_PLAN_H
#define LOOM_IR_PLAN_H

#include "ir.h"

typedef enum loom_ir_kernel_kind {
    /* one loop nest over the root's shape: elementwise ops, broadcasts, transposes and
     * constants, fused; the root is the last node (the one whose value is written) */
    LOOM_IR_KERNEL_ELEMENTWISE,
    /* a reduction (root) with its elementwise prologue (the chain feeding it, evaluated
     * inside the reduction loop) and elementwise epilogue (ops on the reduced value); up to
     * LOOM_IR_KERNEL_REDUCTIONS_MAX reductions over operands of one shape along the same
     * axes share the kernel (one pass over their operands), the root the first; where they
     * reduce rows, one may read another's reduced value broadcast over its row (a later
     * stage: codegen reduces each row stage by stage, softmax's max then sum), and results
     * of the operand's shape may read them too (a last, elementwise stage over the row) */
    LOOM_IR_KERNEL_REDUCTION,
    /* rooted at an op that owns its loops (ir/kinds.def's roots: a matmul, a convolution or a
     * max pool), with an elementwise epilogue (bias, activation, cast); its operands are read
     * from buffers (but casts and transposes into a 16-bit matmul's). Printed "rooted". */
    LOOM_IR_KERNEL_ROOTED,
    /* collectives (ops.def kind COLLECTIVE), run on the host through the communicator, not
     * compiled: one node, or a bucket of ALL_REDUCEs with the same dtype, reduce op and
     * scale, reduced as one flat buffer (the allreduce bucketing pass). Every node is a
     * result and its operand an arg (never computed here). The collective starts where the
     * kernel stands in the plan and completes before kernel `wait_before` */
    LOOM_IR_KERNEL_COLLECTIVE,
    LOOM_IR_KERNEL_COUNT_
} loom_ir_kernel_kind;

enum { LOOM_IR_KERNEL_REDUCTIONS_MAX = 4 };
/* The most nodes fusion puts in one kernel: a kernel is one loop body for LLVM, whose
 * scheduler costs grow with the square of a block's length (a 25,000-op chain in one kernel
 * compiled in 11 s), so a longer chain is split into kernels of this many nodes, each one
 * more pass over memory than the fused chain: nothing at this length. */
enum { LOOM_IR_KERNEL_NODES_MAX = 512 };

/* Whether reductions a and b may share a REDUCTION kernel's loops: they reduce operands of
 * one shape along the same axes, with the same keepdim (so their results share a shape). */
bool loom_ir_reductions_share_loops(const loom_ir_graph *g, int32_t a, int32_t b);

typedef struct loom_ir_kernel {
    loom_ir_kernel_kind kind;
    int32_t root;      /* the reduction / matmul node; for ELEMENTWISE the last node */
    int32_t n_nodes;   /* nodes computed inside the kernel, in graph order */
    int32_t *nodes;
    int32_t n_args;    /* nodes whose values the kernel reads from buffers */
    int32_t *args;
    int32_t n_results; /* nodes whose values the kernel writes to buffers */
    int32_t *results;
    /* COLLECTIVE: the kernel before which it completes (after this one, at most n_kernels:
     * at the end, before the copies); every reader of its results comes at or after it.
     * 0 for other kinds. */
    int32_t wait_before;
} loom_ir_kernel;

typedef enum loom_ir_buffer_kind {
    LOOM_IR_BUFFER_INPUT,  /* graph input `index` (the caller's buffer) */
    LOOM_IR_BUFFER_OUTPUT, /* graph output `index` (the caller's buffer) */
    LOOM_IR_BUFFER_ARENA,  /* `offset` bytes into the step's scratch arena */
    LOOM_IR_BUFFER_COUNT_
} loom_ir_buffer_kind;

typedef struct loom_ir_placement {
    loom_ir_buffer_kind kind;
    int32_t index;  /* INPUT / OUTPUT */
    size_t offset;  /* ARENA: 64-byte aligned */
    size_t bytes;   /* the value's size */
} loom_ir_placement;

/* After all kernels: copy node's value into graph output `output`. */
typedef struct loom_ir_copy {
    int32_t node;
    int32_t output;
} loom_ir_copy;

typedef struct loom_ir_plan {
    loom_allocator alloc;
    loom_ir_arena arena;      /* kernels' node/arg/result arrays */
    loom_ir_kernel *kernels;  /* in execution order */
    int32_t n_kernels, cap_kernels;
    int32_t n_nodes;          /* of the graph the plan is for */
    int32_t *node_kernel;     /* per node: its kernel, or -1 */
    loom_ir_placement *placement; /* per node, meaningful where has_placement */
    bool *has_placement;
    loom_ir_copy *copies;
    int32_t n_copies, cap_copies;
    size_t arena_bytes;       /* scratch arena size */
    size_t peak_bytes;        /* planned peak: arena + outputs that do not alias inputs */
} loom_ir_plan;

/* "elementwise", "reduction", "matmul", "collective" ("?" out of range); a static string. */
const char *loom_ir_kernel_kind_name(loom_ir_kernel_kind k);

void loom_ir_plan_init(loom_ir_plan *p, const loom_allocator *a);
void loom_ir_plan_deinit(loom_ir_plan *p);
/* Empties p and sizes its per-node arrays for g (every node_kernel -1, no placements). */
loom_status loom_ir_plan_reset(loom_ir_plan *p, const loom_ir_graph *g);
/* Whether `operand` (an operand of matmul node `mm`) may be computed inside mm's kernel:
 * 16-bit (bf16, f16) matmuls evaluate their operands while packing them, so a CAST (the
 * autocast of an f32 weight) or a TRANSPOSE feeding one joins it instead of costing a
 * pass over memory of its own. So does a transpose of the last two axes of a large operand
 * of an f32 matmul of many rows (loom_ir_f32_transpose_fuses: GPT-2's tied lm_head
 * x wte^T, wte^T 51 MB, transposed at a few GB/s every step; its layers' W^T and dy^T);
 * codegen packs every f32 matmul with such an operand. Every other matmul operand is an
 * arg. */
enum {
    LOOM_IR_MM_FUSE_T_ELEMS = 1 << 20, /* f32: the transposed operand's elements, at least */
    LOOM_IR_MM_FUSE_T_ROWS = 64,       /* and the product's rows; */
    /* or at least this many elements and rows. Packed from their buffers 16 x 16 at a time
     * (codegen's direct packing), GPT-2's layers' W^T and dy^T (2^16 to 2^18 elements, 256
     * rows and more) cost less in the matmul than the transposes did: on a Zen 4 (2 threads,
     * loom-ir run) [256,256] @ [768,256]^T 0.53-0.86 -> 0.47-0.58 ms, [1024,256]^T from dy
     * @ x 0.74 -> 0.61. The MLP's 64-row layers stay on the matmul schedule, faster there. */
    LOOM_IR_MM_FUSE_T_SMALL_ELEMS = 1 << 16,
    LOOM_IR_MM_FUSE_T_SMALL_ROWS = 256,
};
static inline bool loom_ir_f32_transpose_fuses(int64_t elems, int64_t rows) {
    return (elems >= LOOM_IR_MM_FUSE_T_ELEMS && rows >= LOOM_IR_MM_FUSE_T_ROWS) ||
           (elems >= LOOM_IR_MM_FUSE_T_SMALL_ELEMS && rows >= LOOM_IR_MM_FUSE_T_SMALL_ROWS);
}
bool loom_ir_matmul_operand_fuses(const loom_ir_graph *g, int32_t mm, int32_t operand);
/* Whether output `output` of g, which aliases a graph input, may be written by its kernel
 * straight into the donated input's buffer: the output is a result of an ELEMENTWISE
 * kernel, or of a MATMUL kernel's epilogue (not its root), with no broadcast, transpose,
 * slice, pad, concat, rand_uniform, reduction or product of the input inside (so it
 * reads every element of the input, through args of the output's shape, only at the
 * index it writes, and writes that element once: fusion's rule for outputs), and nothing
 * reads the input afterwards (no later kernel, no copy). A matmul kernel therefore never
 * accumulates its product in a result that has an arg's shape (codegen/lower_matmul.c).
 * Needs the kernels (fusion's part) only. */
bool loom_ir_plan_can_update_in_place(const loom_ir_plan *p, const loom_ir_graph *g,
                                      int32_t output);
/* The value whose arena block kernel k's scatter_add may take for its result, or -1: k roots a
 * scatter_add stored as its result, whose base (through reshapes) is a kernel's value of the
 * result's bytes that nothing else in k reads (not its indices, src or epilogue). The kernel
 * reads each base element before it writes that element's sum, in the task that owns it
 * (codegen/lower_index.c), so the sums may start in the base's own bytes. Whether the base
 * dies at k (no later kernel or copy reads it) is the caller's to check: memory planning
 * takes the block then, and the plan verifier lets the two share it. */
int32_t loom_ir_plan_scatter_base(const loom_ir_plan *p, const loom_ir_graph *g, int32_t k);
/* What kernel kn of a plan for g costs per run, as the plan's printout says: the estimated
 * arithmetic of its nodes (loom_ir_node_flops) and the bytes of its args and results, each
 * read or written once. */
void loom_ir_kernel_cost(const loom_ir_kernel *kn, const loom_ir_graph *g, double *out_flops,
                         double *out_bytes);
/* Which kernels of p (for g) can share code, because codegen would emit the same code for
 * them (plan_share.c): rep[k] (plan->n_kernels entries) is the first kernel with k's
 * structure, k itself when none before it has it. The same structure: the same kind, args
 * of the same types, the same nodes in order (op, type, autocast tag, attributes) reading the
 * same operands (as positions among the kernel's args and nodes), the same root and results.
 * COLLECTIVE kernels are their own. *out_distinct (may be NULL): how many distinct
 * kernels there are. Errors: OUT_OF_MEMORY. */
loom_status loom_ir_plan_share_kernels(const loom_ir_plan *p, const loom_ir_graph *g, int32_t *rep,
                                       int32_t *out_distinct);
/* Checks the rules above. Errors: VERIFY_FAILED with a message naming kernel and node. */
loom_status loom_ir_plan_verify(const loom_ir_plan *p, const loom_ir_graph *g, loom_ir_diag *d);
/* Human-readable summary for dumps: one block per kernel (kind, root, nodes with their
 * source locations, args, results), placements, copies, arena and peak bytes. */
loom_status loom_ir_plan_print(const loom_ir_plan *p, const loom_ir_graph *g,
                               loom_ir_write_fn write, void *ud);

/* ---- the planned memory report (plan_memory.c) -------------------------------------------- */

/* A value alive at the planned peak: an arena value or an output buffer. */
typedef struct loom_ir_live_value {
    int32_t node;
    size_t bytes;
    loom_ir_buffer_kind kind; /* ARENA or OUTPUT */
    int32_t output;           /* OUTPUT: which */
} loom_ir_live_value;

typedef struct loom_ir_memory_report {
    loom_allocator alloc;
    size_t peak_bytes; /* the plan's: arena + outputs that alias no input */
    size_t arena_bytes, output_bytes;
    int32_t peak_kernel;      /* where the most bytes are alive (-1: no kernels) */
    size_t live_bytes;        /* alive there: arena values + output buffers (<= peak_bytes; the
                               * arena may be larger than any live set: fragmentation) */
    loom_ir_live_value *live; /* alive there, largest first */
    int32_t n_live;
    size_t *live_per_kernel; /* per kernel, the same sum */
    int32_t n_kernels;
} loom_ir_memory_report;

/* Where the placed plan p (for g) holds the most bytes and what is alive there, before
 * anything runs: an arena value is alive from the kernel writing it to its last reader
 * (through views; to the end when a copy reads it; at least until a collective writing it
 * completes); outputs that alias no input for the whole step. Free with
 * loom_ir_memory_report_deinit. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY. */
loom_status loom_ir_plan_memory(const loom_ir_plan *p, const loom_ir_graph *g,
                                loom_ir_memory_report *out);
void loom_ir_memory_report_deinit(loom_ir_memory_report *r);
/* "memory: planned peak N bytes (X MiB) = arena A + outputs O", then the kernel where the
 * most is alive and the top (all when < 0) live values, largest first, one a line: bytes,
 * node, op, type, "(output)", the user's file:line. */
void loom_ir_memory_report_print(const loom_ir_memory_report *r, const loom_ir_plan *p,
                                 const loom_ir_graph *g, int32_t top, loom_ir_write_fn write,
                                 void *ud);
/* An SVG picture of the live bytes over the kernel schedule, the peak marked. */
void loom_ir_memory_report_svg(const loom_ir_memory_report *r, const loom_ir_plan *p,
                               const loom_ir_graph *g, loom_ir_write_fn write, void *ud);

#endif
