/* Lowering of one plan kernel to an MLIR function: the driver (scratch, the function and its
 * buffers, dispatch by kernel kind to lower_elementwise.c, lower_reduction.c, lower_matmul.c,
 * lower_conv.c and lower_pool.c). Below, how the whole lowering works: iteration spaces, index
 * maps and loop nests (loop_nest.c), the per-element evaluation of fused nodes (lower_eval.c).
 *
 * How a kernel becomes loops
 *  - Every value is evaluated "at an index" of a loop nest. A node's index is described by
 *    a map from its axes to the nest's iteration dims (or -1: index 0). Elementwise ops pass
 *    their map to their operands; a broadcast drops or zeroes axes; a transpose permutes
 *    them. So broadcasts and transposes cost nothing but index arithmetic, and a value read
 *    through two different maps is computed twice (memoized per map).
 *  - A leaf (an arg read from its buffer) is then an affine function of the iteration dims:
 *    offset = sum_d iter[d] * S[d]. Adjacent dims merge into one loop when every leaf (and
 *    every stored result) is contiguous across them, S[d] == S[d+1] * ext[d+1]: a plain
 *    chain over [64,1000] becomes one loop of 64000, a bias broadcast over [64,1000] stays
 *    two loops. Extent-1 dims vanish.
 *  - ELEMENTWISE: the outer loop [lo, hi) runs over the outer dims times blocks of the
 *    innermost dim (blocks of BLOCK elements once it exceeds BLOCK_MAX), the inner loop is
 *    contiguous for LLVM's loop vectorizer. A nest reading some leaf transposed (strided
 *    along the innermost loop, contiguous along an outer group) runs in tiles of that group
 *    instead, the tile innermost (transposed_group).
 *  - REDUCTION: the nest is the reduce operand's dims. When its innermost dim is reduced,
 *    the outer loop runs over the kept elements and nested loops accumulate in a scalar
 *    (vectorized as a reduction after compile.c marks the add reassociable), unless reduced
 *    dims lie outside the innermost kept dim as well (batch norm's sums over batch and
 *    pixels): then a task takes a tile of that kept dim and, for each element of the
 *    outer reduced dims, sums the tile's contiguous run into a stack buffer of the tile's
 *    accumulators (per output it read a run per image, a layer apart), or, where the runs
 *    are 64 elements or fewer, adds each run element into an accumulator of its own, four
 *    images at a time, and sums the runs at the end; a max over a few
 *    elements (a pool's window) is instead unrolled under a loop over the innermost kept
 *    dim, which LLVM vectorizes across outputs. When the innermost dim is kept (column
 *    sums), a tile of RED_TILE outputs accumulates in a stack buffer and the innermost
 *    loop runs across the tile, contiguous. Float sums accumulate in f64 (the
 *    interpreter's order differs, its precision does not: results match to the last bit
 *    or so), max in the compute type, integers in their own width (wrapping, as the
 *    interpreter's int64 sums stored narrow). Prologue results are stored inside the
 *    accumulation loop (each operand element is visited exactly once), epilogue results
 *    after it. A kernel of several reductions (fusion's reduction siblings) runs them in
 *    the same loops, an accumulator each, its epilogue reading all of them.
 *  - MATMUL: the outer loop runs over (batch, block of 32..128 rows, block of columns); each
 *    block computes C[rows, cols] = A rows x B[:, cols] (i, k, j order: the j loop is
 *    contiguous), or, with use_linalg, a static-shape linalg.matmul on memref views for the
 *    matmul schedule. Columns are split only when there are few row blocks and N is large
 *    (conv1's W[32,9] x cols[9,43264] would otherwise be one task on one thread; splitting
 *    the MLP's N = 512 made it slower); a column block is
 *    a multiple of 16 dividing N when one is near, so most kernels keep one static shape.
 *    f32 accumulates in f32 (the interpreter uses double: differences ~sqrt(K) ulp),
 *    f16/bf16 in f32, integers wrap. The epilogue then runs over the block's rows and
 *    columns. 16-bit matmuls first pack the task's rows of A and columns of B, evaluating
 *    the operands (a cast or transpose fused into the kernel costs no pass of its own;
 *    B is packed once per column block of a call's consecutive tasks): in bf16 pairs for
 *    the vdpbf16ps microkernel (8 x 32 or 16 x 16 C tiles, 16 accumulators) where the
 *    CPU has AVX512-BF16, else converted to f32 for an FMA microkernel of the same tiles.
 *  - A convolution (conv2d and its gradients) is a MATMUL kernel's root too: an implicit
 *    GEMM per group on the same packed microkernel, its windows packed from the
 *    activations block by block, then the epilogue as a matmul's (lower_conv.c).
 *  - Results whose shape is not the kernel's iteration space (rare: a small value fused
 *    into a kernel over a larger one) are computed by a separate nest that only the task
 *    starting at lo == 0 runs.
 *  - Maps are affine per axis (index = off + scale * iteration dim), so a slice is free
 *    index arithmetic like a transpose. Values computed from the index itself register the
 *    affine function they need as a leaf while the nest is planned, which keeps the dims it
 *    reads unmerged: iota (the index along its axis), rand_uniform (its row-major index,
 *    hashed), pad (the index along each padded axis: the operand, an arg or a slice of one,
 *    is loaded at the clamped position and selected against the pad value). An elementwise
 *    nest's innermost loop is split where pads without interior padding enter or leave their
 *    operand along it: in each part such a pad is a plain contiguous load or its constant
 *    (the conv backward's sum of nine shifted pads vectorizes, ~3.5x faster).
 *  - A concat is always its kernel's root (fusion.c): one nest per operand over its part
 *    of the result, in which the concat reads that operand alone at an offset; the task
 *    range [lo, hi) runs over the nests one after the other.
 *
 * Values live in a compute type: f32 for f32, f16 and bf16 (16-bit results are rounded
 * after every node, as the interpreter stores them), f64, i32, i64, i1 for bool. */
#include <math.h>
#include <string.h>

#include "lower_internal.h"

/* ---- scratch ------------------------------------------------------------------------------ */

loom_status loom_cg_scratch_create(const loom_ir_graph *g, const loom_allocator *a,
                                   cg_scratch **out) {
    *out = NULL;
    cg_scratch *s = loom_ir_alloc(a, sizeof *s);
    if (!s)
        return LOOM_STATUS_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->alloc = *a;
    s->n_nodes = g->n_nodes;
    size_t n = (size_t)(g->n_nodes > 0 ? g->n_nodes : 1);
    s->buf_of = loom_ir_alloc(a, n * sizeof(int32_t));
    s->res_of = loom_ir_alloc(a, n * sizeof(int32_t));
    s->memo_head = loom_ir_alloc(a, n * sizeof(int32_t));
    s->in_kernel = loom_ir_alloc(a, n);
    s->dep_root = loom_ir_alloc(a, n);
    if (!s->buf_of || !s->res_of || !s->memo_head || !s->in_kernel || !s->dep_root) {
        loom_cg_scratch_destroy(s);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        s->buf_of[i] = s->res_of[i] = s->memo_head[i] = -1;
    memset(s->in_kernel, 0, n);
    memset(s->dep_root, 0, n);
    *out = s;
    return LOOM_OK;
}

void loom_cg_scratch_destroy(cg_scratch *s) {
    if (!s)
        return;
    size_t n = (size_t)(s->n_nodes > 0 ? s->n_nodes : 1);
    loom_ir_free(&s->alloc, s->buf_of, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->res_of, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->memo_head, n * sizeof(int32_t));
    loom_ir_free(&s->alloc, s->in_kernel, n);
    loom_ir_free(&s->alloc, s->dep_root, n);
    loom_ir_free(&s->alloc, s->memo, (size_t)s->cap_memo * sizeof(memo_ent));
    loom_ir_free(&s->alloc, s->leaves, (size_t)s->cap_leaves * sizeof(leaf));
    loom_allocator a = s->alloc;
    loom_ir_free(&a, s, sizeof *s);
}

/* ---- entry points ----------------------------------------------------------------------- */

static loom_status kernel_begin(kc *c) {
    const loom_ir_kernel *k = c->k;
    cg_scratch *s = c->s;
    int32_t n = c->g->n_nodes;
    if (s->n_nodes != n)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL,
                                "codegen: scratch sized for another graph");
    if (k->n_args + k->n_results > 2 * 1024)
        return loom_ir_diag_set(c->d, LOOM_STATUS_UNSUPPORTED,
                                "codegen: kernel %d reads and writes %d buffers (limit 2048)",
                                (int)c->kid, (int)(k->n_args + k->n_results));
    if (k->root < 0 || k->root >= n)
        return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: kernel %d: bad root %d",
                                (int)c->kid, (int)k->root);
    for (int32_t i = 0; i < k->n_nodes; i++) {
        if (k->nodes[i] < 0 || k->nodes[i] >= n)
            return cg_bad_plan(c, k->root, "a node id out of range");
        s->in_kernel[k->nodes[i]] = 1;
    }
    for (int32_t i = 0; i < k->n_args; i++) {
        if (k->args[i] < 0 || k->args[i] >= n)
            return cg_bad_plan(c, k->root, "an arg id out of range");
        s->buf_of[k->args[i]] = i;
    }
    for (int32_t i = 0; i < k->n_results; i++) {
        int32_t id = k->results[i];
        if (id < 0 || id >= n || !s->in_kernel[id])
            return cg_bad_plan(c, k->root, "a result that is not computed in the kernel");
        s->res_of[id] = k->n_args + i;
    }
    if (!s->in_kernel[k->root])
        return cg_bad_plan(c, k->root, "the root is not among the kernel's nodes");
    /* nodes depending on the root, or on any reduction of a REDUCTION kernel (graph order =
     * topological order) */
    for (int32_t i = 0; i < k->n_nodes; i++) {
        int32_t id = k->nodes[i];
        const loom_ir_node *nd = &c->g->nodes[id];
        bool dep = id == k->root ||
                   (k->kind == LOOM_IR_KERNEL_REDUCTION && loom_ir_op_traits(nd->op)->reduces);
        for (int32_t j = 0; j < nd->n_inputs && !dep; j++)
            dep = nd->inputs[j] >= 0 && nd->inputs[j] < n && s->dep_root[nd->inputs[j]];
        s->dep_root[id] = dep;
    }
    c->bound = -1;
    return LOOM_OK;
}

static void kernel_end(kc *c) {
    const loom_ir_kernel *k = c->k;
    cg_scratch *s = c->s;
    int32_t n = c->g->n_nodes;
    for (int32_t i = 0; i < k->n_nodes; i++)
        if (k->nodes[i] >= 0 && k->nodes[i] < n)
            s->in_kernel[k->nodes[i]] = s->dep_root[k->nodes[i]] = 0;
    for (int32_t i = 0; i < k->n_args; i++)
        if (k->args[i] >= 0 && k->args[i] < n)
            s->buf_of[k->args[i]] = -1;
    for (int32_t i = 0; i < k->n_results; i++)
        if (k->results[i] >= 0 && k->results[i] < n)
            s->res_of[k->results[i]] = -1;
    cg_memo_pop(c, 0);
}

/* A ROOTED kernel, by its root's kind (ir/kinds.def's roots). */
static loom_status lower_rooted(kc *c, const loom_ir_node *root) {
    switch (loom_ir_op_table[root->op].kind) {
    case LOOM_IR_KIND_CONTRACTION: return cg_lower_matmul(c);
    case LOOM_IR_KIND_CONV: return cg_lower_conv(c);
    case LOOM_IR_KIND_POOL: return cg_lower_pool(c);
    case LOOM_IR_KIND_SCATTER: return cg_lower_scatter(c);
    case LOOM_IR_KIND_ATTENTION: return cg_lower_attention(c);
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_CAST:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_SLICE:
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_CONCAT:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_RAND:
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_COLLECTIVE:
    case LOOM_IR_KIND_COUNT_: break;
    }
    return cg_bad_plan(c, c->k->root,
                       "a ROOTED kernel whose root is no matmul, convolution or pool");
}

static loom_status lower(kc *c) {
    loom_status st = kernel_begin(c);
    if (st == LOOM_OK) {
        const loom_ir_node *root = &c->g->nodes[c->k->root];
        switch (c->k->kind) {
        case LOOM_IR_KERNEL_ELEMENTWISE: st = cg_lower_elementwise(c); break;
        case LOOM_IR_KERNEL_REDUCTION:
            st = root->op == LOOM_IR_OP_REDUCE_SUM || root->op == LOOM_IR_OP_REDUCE_MEAN ||
                         root->op == LOOM_IR_OP_REDUCE_MAX
                     ? cg_lower_reduction(c)
                     : cg_bad_plan(c, c->k->root, "a REDUCTION kernel whose root is no reduction");
            break;
        case LOOM_IR_KERNEL_ROOTED: st = lower_rooted(c, root); break;
        case LOOM_IR_KERNEL_COLLECTIVE: /* the runtime runs these on the host */
            st = cg_bad_plan(c, c->k->root, "a COLLECTIVE kernel has no code to compile");
            break;
        case LOOM_IR_KERNEL_COUNT_: st = cg_bad_plan(c, c->k->root, "unknown kernel kind"); break;
        }
    }
    kernel_end(c);
    return st;
}

static kc *kc_new(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k, cg_scratch *s,
                  loom_ir_diag *d) {
    kc *c = loom_ir_alloc(&s->alloc, sizeof *c);
    if (!c)
        return NULL;
    memset(c, 0, sizeof *c);
    c->g = g;
    c->k = &plan->kernels[k];
    c->kid = k;
    c->s = s;
    c->d = d;
    c->bound = -1;
    c->in_dim = -1;
    return c;
}

loom_status loom_cg_kernel_check(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k,
                                 cg_scratch *s, int64_t *out_extent, int64_t *out_grain,
                                 loom_ir_diag *d) {
    kc *c = kc_new(g, plan, k, s, d);
    if (!c)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    loom_status st = lower(c);
    if (st == LOOM_OK) {
        *out_extent = c->extent > 0 ? c->extent : 1;
        *out_grain = c->grain > 0 ? c->grain : 1;
    }
    loom_ir_free(&s->alloc, c, sizeof *c);
    return st;
}

loom_status loom_cg_kernel_emit(cg_b *b, const loom_ir_graph *g, const loom_ir_plan *plan,
                                int32_t k, const char *name, bool use_linalg, cg_scratch *s,
                                loom_ir_diag *d) {
    kc *c = kc_new(g, plan, k, s, d);
    if (!c)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    const loom_ir_kernel *kr = c->k;
    int32_t nb = kr->n_args + kr->n_results;
    if (nb > 2 * 1024) {
        loom_ir_free(&s->alloc, c, sizeof *c);
        return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                                "codegen: kernel %d has %d buffers (limit 2048)", (int)k, (int)nb);
    }
    c->b = b;
    c->emit = true;
    c->use_linalg = use_linalg;
    /* func.func @name(memref<N x T>..., index, index) */
    size_t tbytes = (size_t)(nb + 2) * (sizeof(MlirType) + sizeof(MlirLocation));
    MlirType *types = loom_ir_alloc(&s->alloc, tbytes);
    if (!types) {
        loom_ir_free(&s->alloc, c, sizeof *c);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    }
    MlirLocation *locs = (MlirLocation *)(types + nb + 2);
    for (int32_t i = 0; i < nb; i++) {
        int32_t id = i < kr->n_args ? kr->args[i] : kr->results[i - kr->n_args];
        const loom_ir_node *n = &g->nodes[id >= 0 && id < g->n_nodes ? id : 0];
        int64_t numel = loom_ir_numel(n->rank, n->shape);
        types[i] = mlirMemRefTypeContiguousGet(cg_storage_type(b, n->dtype), 1, &numel,
                                               mlirAttributeGetNull());
    }
    types[nb] = types[nb + 1] = b->index;
    for (int32_t i = 0; i < nb + 2; i++)
        locs[i] = b->loc;
    MlirType fty = mlirFunctionTypeGet(b->ctx, nb + 2, types, 0, NULL);
    MlirRegion region = mlirRegionCreate();
    MlirBlock entry = mlirBlockCreate(nb + 2, types, locs);
    mlirRegionAppendOwnedBlock(region, entry);
    MlirNamedAttribute attrs[2] = {
        cg_named(b, "sym_name", mlirStringAttrGet(b->ctx, mlirStringRefCreateFromCString(name))),
        cg_named(b, "function_type", mlirTypeAttrGet(fty)),
    };
    MlirOperationState fst =
        mlirOperationStateGet(mlirStringRefCreateFromCString("func.func"), b->loc);
    mlirOperationStateAddAttributes(&fst, 2, attrs);
    mlirOperationStateAddOwnedRegions(&fst, 1, &region);
    MlirOperation fn = mlirOperationCreate(&fst);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(b->module), fn);
    loom_ir_free(&s->alloc, types, tbytes);
    for (int32_t i = 0; i < nb; i++)
        c->bufs[i] = mlirBlockGetArgument(entry, i);
    c->lo = mlirBlockGetArgument(entry, nb);
    c->hi = mlirBlockGetArgument(entry, nb + 1);
    MlirBlock saved = b->block;
    b->block = entry;
    loom_status st = lower(c);
    cg_op(b, "func.return", 0, NULL, 0, NULL, 0, NULL);
    b->block = saved;
    loom_ir_free(&s->alloc, c, sizeof *c);
    return st;
}
