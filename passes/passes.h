/* Loom passes: graph-to-graph rewrites run in order by the pass manager, and the planners
 * that turn a graph into an execution plan (fusion into kernels, memory placement). */
#ifndef LOOM_PASSES_PASSES_H
#define LOOM_PASSES_PASSES_H

#include "ir/ir.h"
#include "ir/plan.h"

/* A pass rewrites g in place and says whether it changed anything. On error the graph is
 * still valid and computes what it computed before (most passes leave it untouched). */
typedef struct loom_pass {
    const char *name;
    loom_status (*run)(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d);
} loom_pass;

typedef struct loom_pass_options {
    bool verify_each; /* run the verifier after every pass (tests, debug builds) */
    /* called after each pass with the graph (dumps); may be NULL */
    void (*after_pass)(const char *pass_name, bool changed, const loom_ir_graph *g, void *ud);
    void *ud;
    /* all-reduce buckets (loom_pass_bucket_allreduces): at least this many MB each; 0: the
     * default, 25 (DDP's); negative: a threshold of 0 (one bucket per all-reduce);
     * INFINITY: one bucket per dtype */
    double allreduce_bucket_mb;
} loom_pass_options;

/* For passes that rebuild the graph into `out`: on st == LOOM_OK out (with g's input count)
 * replaces g and *out_changed is set; otherwise out is freed and g kept. Returns st. */
loom_status loom_pass_replace_graph(loom_ir_graph *g, loom_ir_graph *out, loom_status st,
                                    bool *out_changed);

/* Appends to out a copy of node n (op, type, attributes, location) reading `inputs`
 * (n->n_inputs ids of out): its id. Does nothing and returns -1 when *st is already an
 * error; on failure sets *st and d. */
int32_t loom_pass_add_copy(loom_ir_graph *out, const loom_ir_node *n, const int32_t *inputs,
                           loom_status *st, loom_ir_diag *d);
/* The same for a node described from scratch; and for g's node i reading map[x] (an out id)
 * for each operand x. */
int32_t loom_pass_add_node(loom_ir_graph *out, const loom_ir_node_desc *desc, loom_status *st,
                           loom_ir_diag *d);
int32_t loom_pass_add_mapped(loom_ir_graph *out, const loom_ir_graph *g, int32_t i,
                             const int32_t *map, loom_status *st, loom_ir_diag *d);
/* Appends g's outputs to out, node x as map[x], with their aliases; sets *st and d on
 * failure (nothing when *st is already an error). */
void loom_pass_add_outputs(loom_ir_graph *out, const loom_ir_graph *g, const int32_t *map,
                           loom_status *st, loom_ir_diag *d);

/* Runs the passes in order. A pass error or a verifier failure stops the pipeline; the
 * message names the pass. */
loom_status loom_pass_run_pipeline(loom_ir_graph *g, const loom_pass *const *passes,
                                   int32_t n_passes, const loom_pass_options *opts,
                                   loom_ir_diag *d);

/* The pass with this name ("dce", "cse", "fold"), or NULL. */
const loom_pass *loom_pass_find(const char *name);
/* The registered passes, in a stable order, for listing (`loom-ir opt` names them when a
 * pass is unknown). *out_n gets the count; the array is static. */
const loom_pass *const *loom_pass_all(int32_t *out_n);

/* Autocast: turns the autocast tags of the frontend's scopes (attrs.autocast) into casts by
 * each op's autocast class and clears them; outputs keep their recorded dtypes. The rules are
 * at the top of passes/autocast.c and in include/loom/amp.h. A graph without tags is left
 * untouched (changed = false). Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_autocast;

/* Private casts for 16-bit matmuls: a cast of an f32 value to bf16/f16 that several 16-bit
 * matmuls read (directly or through a transpose), and nothing else, is copied for each of
 * them right before it, so that each evaluates it while packing its operand instead of
 * fusion materializing a shared value (a pass over memory). Runs after CSE. Errors:
 * OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_matmul_casts;

/* Recomputation: a broadcast, or an elementwise op over broadcasts and one value kept
 * alive anyway, that several kernels read is copied at each reader that evaluates it at an
 * index, so that fusion recomputes it there instead of keeping a buffer alive from the
 * forward to the backward (rules at the top of passes/recompute.c). Runs after CSE.
 * Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_recompute;

/* Convolution decomposition (passes/conv_decompose.c), for the convolutions codegen has no
 * kernel for (f64; every one with LOOM_CONV=im2col): conv2d, conv2d_grad_input and
 * conv2d_grad_weight become im2col (pad, strided slices, concat) and matmuls, the gradients
 * as autograd derived them from that im2col.
 * Runs after autocast, before CSE (which merges the im2col a forward and its weight gradient
 * both build). Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_conv_decompose;

/* Reduction factoring: a reduce_sum or reduce_mean (f32, f64) of a product (mul and neg
 * nodes) takes out the factors that do not vary along the summed axes (broadcasts of values
 * that are 1 there, constants) and the sign: sum(a * b * w) becomes sum(a * b) * w', the
 * factors left inside multiplied in node order, so that CSE then merges sums of the same
 * factors (a batch norm's backward: four sums become two). Rules at the top of
 * passes/reduce_factor.c. Runs before CSE. Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_reduce_factor;
/* Moments in one pass: a variance recorded as mean((x - mean(x))^2) over the mean's axes
 * (batch norm's, layer norm's; f32) becomes mean(x^2) - mean(x)^2 from two f64 sums of x,
 * which fusion reads in one kernel; the mean becomes the f64 sum's, rounded: bit for bit the
 * same. Rules and the error bound at the top of passes/moments.c. Runs after CSE, before
 * fold. Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_moments;
/* Dead-code elimination: drops nodes no output depends on (graph inputs stay). */
extern const loom_pass loom_pass_dce;

/* Common-subexpression elimination: structurally identical nodes (same op, dtype, shape,
 * attributes and operands; commutative ops also with their two operands swapped) are merged
 * into the first. INPUT nodes are never merged; outputs follow their node. Locations are
 * not compared: the first node's location is kept. */
extern const loom_pass loom_pass_cse;

/* Constant folding and algebraic simplification, then DCE of what died (inputs stay):
 *  - an elementwise op whose operands are all constants becomes a constant; the value is
 *    computed as the reference interpreter computes it (double / wrapping int64, rounded
 *    through the dtype), so folded graphs give bit-identical results;
 *  - broadcast, reshape and transpose of a constant become constants of the new shape;
 *  - x + (-0.0), x - (+0.0), x * 1, 1 * x, x / 1 become x; for integers also x + 0, 0 + x,
 *    x - 0, and x * 0, 0 * x become 0. For floats x + (+0.0) stays (-0.0 + 0.0 is +0.0)
 *    and x * 0 stays (NaN * 0 and inf * 0 are NaN);
 *  - neg(neg(x)), cast of x to its own dtype, broadcast/reshape of x to its own shape,
 *    transposes with the identity permutation become x; select(c, a, b) with a constant
 *    condition becomes a or b;
 *  - reshape(reshape(x)) becomes reshape(x), broadcast(broadcast(x)) becomes broadcast(x)
 *    and transpose(transpose(x)) one transpose with the composed permutation.
 * A folded value that a constant cannot hold exactly (an i64 beyond 2^53) is not folded. */
extern const loom_pass loom_pass_fold;

/* Index-fold: a gather of a chain of elementwise ops (taking at most half of its axis) moves
 * to the chain's leaves, so the ops run at the gathered elements only (bit for bit the same);
 * a scatter_add into zeros (a gather's gradient) is folded into its readers: a reduce_sum over
 * its axis sums its src instead; an add of it to another value, when nothing else reads it,
 * becomes a scatter_add into that value. Rules at the top of passes/index_fold.c. Runs after
 * fold, then DCE. Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_index_fold;

/* Reduce-split: an f32 sum of a million elements or more per output into fewer than 16
 * outputs (which would run on as many threads) becomes a sum in f64 keeping one of the summed
 * axes, then the sum of those partial sums, rounded to f32 once as before. Rules at the top
 * of passes/reduce_split.c. Errors: OUT_OF_MEMORY (the graph is unchanged). */
extern const loom_pass loom_pass_reduce_split;

/* ---- planning ----------------------------------------------------------------------------- */

/* Fusion: partitions g into kernels (plan->kernels, plan->node_kernel; the plan is reset
 * first), following the rules in ir/plan.h. Placements are left empty. How nodes are grouped
 * is documented at the top of passes/fusion.c. g should be free of dead nodes (run dce):
 * a dead computation still gets a kernel, one without results.
 * Errors: OUT_OF_MEMORY. */
loom_status loom_pass_fuse(const loom_ir_graph *g, loom_ir_plan *plan, loom_ir_diag *d);

/* All-reduce bucketing over a fused plan, before memory planning: single ALL_REDUCE kernels
 * become buckets of at least bucket_bytes (0: one per all-reduce; INT64_MAX: one per dtype,
 * reduce op and scale), filled in the order their operands are computed, each started right
 * after its last member's operand is computed and waited on before its first reader (rules
 * at the top of passes/buckets.c). Placements are left empty. Errors: OUT_OF_MEMORY (the
 * plan is unchanged). */
loom_status loom_pass_bucket_allreduces(const loom_ir_graph *g, loom_ir_plan *plan,
                                        int64_t bucket_bytes, loom_ir_diag *d);

/* Memory planning over a fused plan: a placement for every materialized value, the copies
 * into outputs, arena_bytes and peak_bytes (algorithm at the top of passes/memplan.c).
 * Errors: UNSUPPORTED (outputs exchange donated inputs in a cycle that no order of copies can
 * serve; loom_pass_build_plan breaks such cycles first), OUT_OF_MEMORY. */
loom_status loom_pass_plan_memory(const loom_ir_graph *g, loom_ir_plan *plan, loom_ir_diag *d);

/* The default JIT pipeline in one call: autocast, conv-decompose, dce, reduce-factor, cse, moments,
 * fold, index-fold, reduce-split, matmul-casts, recompute through loom_pass_run_pipeline (opts may
 * be NULL; its dumps and verify_each apply), then fusion, all-reduce bucketing
 * (opts->allreduce_bucket_mb), memory planning and loom_ir_plan_verify. g is rewritten in place;
 * plan (initialized by the caller) describes the rewritten g. When outputs exchange donated inputs
 * (out0 = in1 into in0, out1 = in0 into in1), a cast of one input to its own dtype is appended so
 * that a kernel copies it aside first. Errors: those of the passes, VERIFY_FAILED (a bug),
 * OUT_OF_MEMORY. */
loom_status loom_pass_build_plan(loom_ir_graph *g, const loom_pass_options *opts,
                                 loom_ir_plan *plan, loom_ir_diag *d);

#endif
