/* Fusion: partitions a graph into the kernels of an execution plan (ir/plan.h).
 *
 * Vocabulary. A "loop op" is an elementwise op (unary, predicate, binary, compare, select,
 * cast), a BROADCAST, TRANSPOSE or SLICE, a PAD, an IOTA or a RAND_UNIFORM: evaluated at one
 * index of a loop nest, it needs its operands at one index each (the same index, or one
 * mapped by the broadcast/transpose/slice; iota and rand_uniform compute from the index).
 * A kernel loops over one or two "spaces": ELEMENTWISE kernels over their root's shape;
 * REDUCTION kernels over the reduction's operand (the prologue, inside the reduction loop)
 * and over the reduced shape (the root and its epilogue); MATMUL kernels over the product's
 * shape (the root and its epilogue). Each fused node has an affine map saying, for each of
 * its axes, which axis of its space indexes it (or none, for extents of 1), with an offset
 * and a scale (index = off + scale * space index): a slice composes into the map (start,
 * stride), so it costs nothing but index arithmetic.
 *
 * Ops whose operands are not read at an affine index: a PAD reads its operand from a buffer
 * (clamped index, then a select with the pad value), so its operand never joins it, except
 * a SLICE all of whose users are pads of one kernel: it joins that kernel as a view (codegen
 * composes it into each pad's index) and its own operand stays in a buffer. A CONCAT
 * is always the root of its own ELEMENTWISE kernel, which codegen splits into one loop nest
 * per operand (each operand then is read at an offset map: one pass over memory); its
 * operands join it, and it never joins its users (nor a reduction as an epilogue).
 *
 * Rules.
 *  1. Producers join their consumers (one sweep from the last node to the first). A loop op
 *     joins the kernel of its users when all of them are in that one kernel, they all see it
 *     in the same space through the same map, and
 *       - no user is a matmul (a matmul's operands are materialized), except that a CAST
 *         or TRANSPOSE whose only user is a 16-bit matmul (or a large transpose whose
 *         only user is an f32 matmul: loom_ir_matmul_operand_fuses) joins it in that
 *         operand's own space (SPACE_OPERAND + q): codegen evaluates it while packing the
 *         operand, so the autocast's cast(W f32 -> bf16), transposed or not, and an f32
 *         W^T cost no pass over memory of their own. Only casts and transposes join such a space
 * (codegen recomputes what joins it for each block it packs), and
 *       - it is not a graph output when it joins a space other than its kernel's output
 *         space, and
 *       - if it is a graph output (then it is also written: a result), it has as many
 *         elements as its space, so each element is written exactly once.
 *     (A PAD or an IOTA may be read through several maps: recomputing it costs no more than
 *     reading it from a buffer would.)
 *     A loop op used by a reshape, by several kernels, or by none becomes the root of a new
 *     ELEMENTWISE kernel. Shared values are materialized, never recomputed: the plan's rule
 *     that a node belongs to one kernel keeps each value computed once, and a kernel reading
 *     a buffer costs one pass over memory, which is what recomputing would save. (Where
 *     recomputing saves memory instead, the recompute pass has already given each reader
 *     a copy of its own: passes/recompute.c.)
 *     Reductions and matmuls always start kernels; a reduction's operand chain joins it as its
 *     prologue by the rule above. A convolution (conv2d or a gradient) starts a MATMUL
 *     kernel too, its operands materialized. Each collective is a COLLECTIVE kernel of
 *     its own, which the runtime runs on the host: its operand is materialized and its
 *     value is always a result (the communicator works on buffers); it completes before
 *     the next kernel (the allreduce bucketing pass merges and moves them).
 *  2. Epilogues (one sweep in execution order). An ELEMENTWISE kernel E whose loop space
 *     equals the reduced (or product) shape of a REDUCTION (or MATMUL) kernel T joins T when
 *     T is the latest kernel E reads from (so every other value E reads exists before T
 *     runs), E reads T's values at the identity map and not through a reshape, and, for a
 *     matmul, the values of T that E reads are used by nothing but T and E (the epilogue
 *     never stores an intermediate that something else needs; graph outputs excepted). Several
 *     elementwise kernels may join one reduction (sqrt(mean) and exp(mean) both fuse).
 *     Likewise E joins the ELEMENTWISE kernel T of its shape that runs just before it (no
 *     kernel's root between theirs) as a sibling, when E writes no graph output: T then
 *     writes E's results beside its own (a residual sum and the bf16 cast of its ReLU for the
 *     next convolutions: one pass over the sum instead of two), and E's root becomes T's.
 *     And a REDUCTION kernel (a float sum or mean) joins the REDUCTION kernel just before it
 *     when both reduce operands of one shape along the same axes and it reads nothing that
 *     kernel computes, up to LOOM_IR_KERNEL_REDUCTIONS_MAX reductions: batch norm's
 *     backward sums over dy in one pass (try_reduction_sibling). Where both reduce rows
 *     (the innermost axes), a float reduction joins also when it reads that kernel's reduced
 *     values broadcast over the rows: softmax's max(x) and sum(exp(x - max)), computed
 *     row by row one stage after the other, the row read from memory once. An ELEMENTWISE
 *     kernel over such a kernel's reduced operand that reads of it only those values
 *     joins it as its last stage (try_row_stage): layer norm's normalize, softmax's output.
 *  3. Constants are recomputed inside every kernel that uses them (a fill is free), except
 *     where a buffer is needed: a constant that is a graph output, a matmul or collective
 *     operand or a reshape's operand also gets an ELEMENTWISE kernel of its own that writes it.
 *  4. Results are the computed nodes that are graph outputs or read outside their kernel.
 *     Kernels run in the order of their roots (a merged kernel at its reduction or matmul),
 *     which is topological: every value a kernel reads is written by an earlier root.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* SPACE_OPERAND + q: operand q of a packing matmul, in that operand's shape. */
enum { SPACE_OUT = 0, SPACE_IN = 1, SPACE_OPERAND = 2 };

enum { FUSE_ROW_MIN = 16 }; /* reduced elements per output of a staged kernel, at least */

/* Axis i of a node is read at off[i] + scale[i] * (space axis dim[i]) (just off[i] when
 * dim[i] is -1; then scale[i] is 0). */
typedef struct fmap {
    int8_t dim[LOOM_MAX_RANK];
    int64_t off[LOOM_MAX_RANK];
    int64_t scale[LOOM_MAX_RANK];
} fmap;

typedef struct fnode {
    int32_t kernel; /* fusion kernel id, -1 for inputs, constants, reshapes */
    int8_t space;
    bool pad_view; /* a slice read only by pads of its kernel, through its operand's buffer */
    fmap map;
} fnode;

typedef struct fkernel {
    loom_ir_kernel_kind kind;
    int32_t root;
    int32_t final; /* index in the plan once emitted; -2 once merged into another kernel */
    int32_t first_member, n_members; /* phase-1 members, into fuse_state.members */
    int32_t n_red;                   /* REDUCTION: its reductions (rule 2's siblings join) */
    int32_t n_fused; /* nodes placed in it so far: at most LOOM_IR_KERNEL_NODES_MAX */
} fkernel;

typedef struct fuse_state {
    const loom_ir_graph *g;
    loom_ir_plan *plan;
    fnode *fn;
    fkernel *kernels;
    int32_t n_kernels;
    int32_t *user_start; /* CSR of users: users[user_start[i] .. user_start[i+1]) */
    int32_t *users;
    int32_t *ckernel; /* per node: the kernel materializing this constant, or -1 */
    int32_t *members; /* nodes grouped by phase-1 kernel */
    int32_t *mark;    /* per node scratch marks (kernel ids) */
    int32_t *list;    /* 3 per node: scratch lists of one kernel's nodes, args, results */
    int32_t *kstart;  /* n + 1: bucket bounds of the plan's kernels */
    int32_t *order;   /* n: kernels in execution order */
    bool *is_output;
} fuse_state;

static void identity_map(const loom_ir_node *n, fmap *map) {
    memset(map, 0, sizeof *map);
    for (int32_t i = 0; i < LOOM_MAX_RANK; i++) {
        map->dim[i] = i < n->rank && n->shape[i] != 1 ? (int8_t)i : -1;
        map->scale[i] = map->dim[i] >= 0;
    }
}

static bool map_equal(const fmap *a, const fmap *b) {
    return memcmp(a, b, sizeof *a) == 0; /* every field is always written: no stale bytes */
}

/* The map under which user u (itself under map um) reads its operand number q, or false
 * when it does not read it at an affine index (a pad: its operand is read from a buffer). */
static bool operand_map(const loom_ir_graph *g, int32_t u, const fmap *um, int32_t q, fmap *om) {
    const loom_ir_node *un = &g->nodes[u], *on = &g->nodes[un->inputs[q]];
    memset(om, 0, sizeof *om);
    for (int32_t i = 0; i < LOOM_MAX_RANK; i++)
        om->dim[i] = -1;
    switch (loom_ir_op_table[un->op].kind) {
    case LOOM_IR_KIND_BROADCAST: { /* operand axes align with the result's last axes */
        int32_t off = un->rank - on->rank;
        for (int32_t i = 0; i < on->rank; i++) {
            om->dim[i] = um->dim[off + i];
            om->off[i] = um->off[off + i];
            om->scale[i] = um->scale[off + i];
        }
        break;
    }
    case LOOM_IR_KIND_TRANSPOSE: /* result axis i is operand axis perm[i] */
        for (int32_t i = 0; i < un->rank; i++) {
            om->dim[un->attrs.perm[i]] = um->dim[i];
            om->off[un->attrs.perm[i]] = um->off[i];
            om->scale[un->attrs.perm[i]] = um->scale[i];
        }
        break;
    case LOOM_IR_KIND_SLICE: /* operand index = start + stride * result index */
        for (int32_t i = 0; i < un->rank; i++) {
            om->dim[i] = um->dim[i];
            om->off[i] = un->attrs.start[i] + un->attrs.step[i] * um->off[i];
            om->scale[i] = un->attrs.step[i] * um->scale[i];
        }
        break;
    case LOOM_IR_KIND_CONCAT: { /* operand q starts at the sum of the extents before it */
        int64_t at = 0;
        for (int32_t k = 0; k < q; k++)
            at += g->nodes[un->inputs[k]].shape[un->attrs.index];
        *om = *um;
        om->off[un->attrs.index] -= at;
        break;
    }
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_GATHER: return false;
    case LOOM_IR_KIND_SCATTER:
    case LOOM_IR_KIND_ATTENTION:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_RAND:
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_CAST:
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_CONTRACTION:
    case LOOM_IR_KIND_COLLECTIVE:
    case LOOM_IR_KIND_CONV:
    case LOOM_IR_KIND_POOL:
    case LOOM_IR_KIND_COUNT_:
        for (int32_t i = 0; i < on->rank; i++) {
            om->dim[i] = um->dim[i];
            om->off[i] = um->off[i];
            om->scale[i] = um->scale[i];
        }
        break;
    }
    for (int32_t i = 0; i < on->rank; i++) /* extents of 1 read index 0 whatever the path */
        if (on->shape[i] == 1) {
            om->dim[i] = -1;
            om->off[i] = om->scale[i] = 0;
        }
    return true;
}

static const loom_ir_node *space_node(const fuse_state *s, const fkernel *k, int8_t space) {
    const loom_ir_node *root = &s->g->nodes[k->root];
    if (space >= SPACE_OPERAND)
        return &s->g->nodes[root->inputs[space - SPACE_OPERAND]];
    return space == SPACE_IN ? &s->g->nodes[root->inputs[0]] : root;
}

static int32_t new_kernel(fuse_state *s, loom_ir_kernel_kind kind, int32_t root) {
    int32_t id = s->n_kernels++;
    s->kernels[id] = (fkernel){.kind = kind, .root = root, .final = -1, .n_red = 1, .n_fused = 1};
    return id;
}

/* Rule 1 for loop op i: the kernel it joins (with space and map), or -1. */
static int32_t join_target(const fuse_state *s, int32_t i, int8_t *out_space, fmap *out_map) {
    const loom_ir_graph *g = s->g;
    int32_t target = -1;
    /* A pad reads its operand from a buffer and an iota reads nothing: evaluating one at
     * several indices costs no more than reading it back from memory, so it may join a
     * kernel that reads it through different maps (nothing else reads under its map). */
    const loom_ir_kind_info *own = loom_ir_op_traits(g->nodes[i].op);
    bool recomputable = own->cheap;
    for (int32_t e = s->user_start[i]; e < s->user_start[i + 1]; e++) {
        int32_t u = s->users[e];
        int32_t ku = s->fn[u].kernel;
        if (ku < 0 || (target >= 0 && ku != target) || s->fn[u].pad_view)
            return -1; /* a reshape reads it, or two kernels do, or pads read it through u */
        const loom_ir_node *un = &g->nodes[u];
        for (int32_t q = 0; q < un->n_inputs; q++) { /* each operand position reading i */
            if (un->inputs[q] != i)
                continue;
            int8_t space = SPACE_OUT;
            fmap map;
            /* in a matmul's operand space only casts and transposes are evaluated */
            if (s->fn[u].space >= SPACE_OPERAND && !own->operand_view)
                return -1;
            switch (loom_ir_op_table[un->op].kind) {
            case LOOM_IR_KIND_CONTRACTION:
                if (!loom_ir_matmul_operand_fuses(g, u, i))
                    return -1;
                space = (int8_t)(SPACE_OPERAND + q);
                identity_map(&g->nodes[i], &map);
                break;
            case LOOM_IR_KIND_REDUCTION: /* the root: i is its operand, the prologue's space */
                space = SPACE_IN;
                identity_map(&g->nodes[i], &map);
                break;
            case LOOM_IR_KIND_CONCAT:
                if (s->is_output[i]) /* concat kernels write nothing but the concat */
                    return -1;
                space = s->fn[u].space;
                operand_map(g, u, &s->fn[u].map, q, &map);
                break;
            case LOOM_IR_KIND_UNARY:
            case LOOM_IR_KIND_PREDICATE:
            case LOOM_IR_KIND_BINARY:
            case LOOM_IR_KIND_COMPARE:
            case LOOM_IR_KIND_SELECT:
            case LOOM_IR_KIND_CAST:
            case LOOM_IR_KIND_BROADCAST:
            case LOOM_IR_KIND_TRANSPOSE:
            case LOOM_IR_KIND_SLICE:
            case LOOM_IR_KIND_RAND:
                space = s->fn[u].space;
                operand_map(g, u, &s->fn[u].map, q, &map);
                break;
            case LOOM_IR_KIND_PAD: /* reads its operand from a buffer */
            case LOOM_IR_KIND_GATHER: /* likewise both of its */
            case LOOM_IR_KIND_SCATTER:
            case LOOM_IR_KIND_ATTENTION:
            case LOOM_IR_KIND_IOTA:
            case LOOM_IR_KIND_SOURCE:
            case LOOM_IR_KIND_RESHAPE:
            case LOOM_IR_KIND_COLLECTIVE:
            case LOOM_IR_KIND_CONV:
            case LOOM_IR_KIND_POOL:
            case LOOM_IR_KIND_COUNT_: return -1;
            }
            if (target < 0) {
                target = ku;
                *out_space = space;
                *out_map = map;
            } else if (space != *out_space || (!map_equal(&map, out_map) && !recomputable)) {
                return -1; /* read at two different indices: materialize it instead */
            }
        }
    }
    if (target < 0)
        return -1;
    if (s->is_output[i]) {
        const loom_ir_node *n = &g->nodes[i];
        const loom_ir_node *sp = space_node(s, &s->kernels[target], *out_space);
        if (*out_space != SPACE_OUT ||
            loom_ir_numel(n->rank, n->shape) != loom_ir_numel(sp->rank, sp->shape))
            return -1;
    }
    return target;
}

/* The kernel of the pads that are all of slice i's users, or -1: the slice joins it as a
 * view, each pad reading the slice's operand (which stays in a buffer) at the slice's
 * index (the gradient of a concat feeding the gradients of strided windows: conv2d). */
static int32_t pad_view_target(const fuse_state *s, int32_t i) {
    const loom_ir_graph *g = s->g;
    if (g->nodes[i].op != LOOM_IR_OP_SLICE || s->is_output[i])
        return -1;
    int32_t target = -1;
    for (int32_t e = s->user_start[i]; e < s->user_start[i + 1]; e++) {
        int32_t u = s->users[e], ku = s->fn[u].kernel;
        if (g->nodes[u].op != LOOM_IR_OP_PAD || ku < 0 || (target >= 0 && ku != target))
            return -1;
        target = ku;
    }
    return target;
}

/* Loop op i joins its users' kernel (join_target) or starts a new one. */
static void place_loop_op(fuse_state *s, int32_t i, fnode *f) {
    int8_t space = SPACE_OUT;
    fmap map;
    int32_t k = join_target(s, i, &space, &map);
    if (k >= 0 && s->kernels[k].n_fused < LOOM_IR_KERNEL_NODES_MAX) {
        s->kernels[k].n_fused++;
        f->kernel = k;
        f->space = space;
        f->map = map;
    } else {
        f->kernel = new_kernel(s, LOOM_IR_KERNEL_ELEMENTWISE, i);
    }
}

/* Rule 1: one sweep from the last node to the first, so every user is placed first. */
static void group_producers(fuse_state *s) {
    const loom_ir_graph *g = s->g;
    for (int32_t i = g->n_nodes - 1; i >= 0; i--) {
        const loom_ir_node *n = &g->nodes[i];
        fnode *f = &s->fn[i];
        f->kernel = -1;
        f->space = SPACE_OUT;
        f->pad_view = false;
        identity_map(n, &f->map);
        switch (loom_ir_op_table[n->op].kind) {
        case LOOM_IR_KIND_SOURCE:
            if (n->op == LOOM_IR_OP_CONSTANT) {
                bool needs_buffer = s->is_output[i];
                for (int32_t e = s->user_start[i]; e < s->user_start[i + 1]; e++) {
                    const loom_ir_node *un = &g->nodes[s->users[e]];
                    needs_buffer = needs_buffer || loom_ir_op_traits(un->op)->buffered;
                }
                if (needs_buffer)
                    s->ckernel[i] = new_kernel(s, LOOM_IR_KERNEL_ELEMENTWISE, i);
            }
            break;
        case LOOM_IR_KIND_RESHAPE: break;
        case LOOM_IR_KIND_REDUCTION: f->kernel = new_kernel(s, LOOM_IR_KERNEL_REDUCTION, i); break;
        case LOOM_IR_KIND_CONTRACTION: f->kernel = new_kernel(s, LOOM_IR_KERNEL_ROOTED, i); break;
        case LOOM_IR_KIND_CONCAT: f->kernel = new_kernel(s, LOOM_IR_KERNEL_ELEMENTWISE, i); break;
        case LOOM_IR_KIND_SLICE:
            if ((f->kernel = pad_view_target(s, i)) >= 0) {
                s->kernels[f->kernel].n_fused++;
                f->space = s->fn[s->users[s->user_start[i]]].space;
                f->pad_view = true;
            } else {
                place_loop_op(s, i, f);
            }
            break;
        case LOOM_IR_KIND_PAD:
        case LOOM_IR_KIND_IOTA:
        case LOOM_IR_KIND_RAND:
        case LOOM_IR_KIND_UNARY:
        case LOOM_IR_KIND_PREDICATE:
        case LOOM_IR_KIND_BINARY:
        case LOOM_IR_KIND_COMPARE:
        case LOOM_IR_KIND_SELECT:
        case LOOM_IR_KIND_CAST:
        case LOOM_IR_KIND_BROADCAST:
        case LOOM_IR_KIND_GATHER: /* evaluated in its reader's kernel (lower_eval.c) */
        case LOOM_IR_KIND_TRANSPOSE: place_loop_op(s, i, f); break;
        case LOOM_IR_KIND_COLLECTIVE:
            f->kernel = new_kernel(s, LOOM_IR_KERNEL_COLLECTIVE, i);
            break;
        case LOOM_IR_KIND_CONV: /* a contraction of its own kind: operands from buffers */
        case LOOM_IR_KIND_POOL: /* likewise a window's */
        case LOOM_IR_KIND_SCATTER: /* and a scatter's (codegen/lower_index.c) */
        case LOOM_IR_KIND_ATTENTION: /* and attention's (codegen/lower_attention.c) */
            f->kernel = new_kernel(s, LOOM_IR_KERNEL_ROOTED, i);
            break;
        case LOOM_IR_KIND_COUNT_: break;
        }
    }
}

/* The kernel whose buffer holds value b (not an input), or -1. */
static int32_t producer(const fuse_state *s, int32_t b) {
    return s->g->nodes[b].op == LOOM_IR_OP_CONSTANT ? s->ckernel[b] : s->fn[b].kernel;
}

/* Whether ELEMENTWISE kernel e may join ELEMENTWISE kernel t as a sibling (rule 2): t
 * writes neither a concat nor a constant alone; e writes no graph output (outputs may be
 * written in place of an input); and no kernel's root lies between theirs, so t runs just
 * before e (e's values are made no earlier than they were) and t, rooted at e's root from
 * then on, keeps its place among the kernels. */
static bool sibling_ok(const fuse_state *s, int32_t t, int32_t e) {
    int32_t lo = s->kernels[t].root, hi = s->kernels[e].root;
    loom_ir_op op = s->g->nodes[lo].op;
    if (op == LOOM_IR_OP_CONCAT || op == LOOM_IR_OP_CONSTANT || lo >= hi)
        return false;
    const fkernel *ke = &s->kernels[e];
    for (int32_t m = 0; m < ke->n_members; m++) /* graph outputs keep their own kernels */
        if (s->is_output[s->members[ke->first_member + m]])
            return false;
    for (int32_t k = 0; k < s->n_kernels; k++)
        if (s->kernels[k].final != -2 && s->kernels[k].root > lo && s->kernels[k].root < hi)
            return false;
    return true;
}

/* Whether reduction r reduces rows: every reduced axis (of extent > 1) of its operand lies
 * after every kept one, so codegen's task is one output and all of its reduced elements
 * (the form a staged kernel needs), and a row is at least FUSE_ROW_MIN elements (a
 * vector: shorter rows loop better across rows, in kernels of their own). */
static bool reduces_rows(const loom_ir_graph *g, int32_t r) {
    const loom_ir_node *rn = &g->nodes[r], *x = &g->nodes[rn->inputs[0]];
    bool seen_red = false;
    int64_t n_red = 1;
    for (int32_t d = 0; d < x->rank; d++) {
        bool red = (rn->attrs.axes >> d) & 1u;
        if (x->shape[d] == 1)
            continue;
        if (!red && seen_red)
            return false;
        seen_red = seen_red || red;
        n_red *= red ? x->shape[d] : 1;
    }
    return n_red >= FUSE_ROW_MIN;
}

/* Whether member u, reading its operand q from REDUCTION kernel t (which reduces rows),
 * reads it at u's own row: a value of t's reduced shape (a reduction or its epilogue,
 * keepdim) at the row's index, u broadcasting it back over the reduced axes as softmax's
 * x - max(x) does, or being itself of the reduced shape (layer norm's backward scales its
 * row sum before broadcasting it); or a value over t's reduced operand (its prologue or an
 * elementwise stage) at the same element (layer norm's backward sums a stage's values).
 * Codegen evaluates either at any stage after the reductions it reads. */
static bool reads_row_value(const fuse_state *s, int32_t t, int32_t u, int32_t q) {
    const loom_ir_graph *g = s->g;
    const loom_ir_node *un = &g->nodes[u], *tr = &g->nodes[s->kernels[t].root];
    int32_t o = un->inputs[q];
    const loom_ir_node *on = &g->nodes[o];
    fmap om, own;
    if (!tr->attrs.keepdim)
        return false;
    if (loom_ir_op_traits(un->op)->reduces) /* a reduction reads its operand at its index */
        identity_map(on, &om);
    else if (!operand_map(g, u, &s->fn[u].map, q, &om))
        return false;
    if (loom_ir_same_shape(on, &g->nodes[tr->inputs[0]]))
        return s->fn[o].space == SPACE_IN && map_equal(&om, &s->fn[o].map);
    if (!loom_ir_same_shape(on, tr))
        return false;
    identity_map(on, &own);
    return map_equal(&om, &own);
}

/* Rule 2 for REDUCTION kernel e (a float reduction with its prologue): merges it into the
 * REDUCTION kernel t just before it (no kernel's root between theirs) when both reduce
 * operands of one shape along the same axes, the two hold at most
 * LOOM_IR_KERNEL_REDUCTIONS_MAX reductions together, and either
 *  - (siblings) both are float sums or means and e reads nothing t computes, directly or
 *    through a reshape: batch norm's backward, sum(dy) and sum(dy * (x - mean)), one pass
 *    over dy instead of two; or
 *  - (stages) both reduce rows (reduces_rows) and e reads t's values only at their rows
 *    (reads_row_value): softmax's sum(exp(x - max(x))), a variance after its mean, the
 *    second row sum of layer norm's backward.
 *    Codegen then runs, per row, the reduction loops one stage after the other (a stage
 *    reads the reduced values of the stages before it), so the second pass over the row
 *    reads it from the caches: one pass over memory instead of two.
 * e then runs at t's place: every value it reads is made before t (no root between), and
 * its readers come after e's old place. */
static void try_reduction_sibling(fuse_state *s, int32_t e) {
    const loom_ir_graph *g = s->g;
    const fkernel *ke = &s->kernels[e];
    int32_t t = -1;
    for (int32_t k = 0; k < s->n_kernels; k++)
        if (s->kernels[k].final != -2 && s->kernels[k].root < ke->root &&
            (t < 0 || s->kernels[k].root > s->kernels[t].root))
            t = k;
    if (t < 0 || s->kernels[t].kind != LOOM_IR_KERNEL_REDUCTION)
        return;
    const loom_ir_node *tr = &g->nodes[s->kernels[t].root], *er = &g->nodes[ke->root];
    if (!loom_ir_dtype_is_float(tr->dtype) || !loom_ir_dtype_is_float(er->dtype) ||
        !loom_ir_reductions_share_loops(g, s->kernels[t].root, ke->root))
        return;
    bool sums = (tr->op == LOOM_IR_OP_REDUCE_SUM || tr->op == LOOM_IR_OP_REDUCE_MEAN) &&
                (er->op == LOOM_IR_OP_REDUCE_SUM || er->op == LOOM_IR_OP_REDUCE_MEAN);
    bool rows = reduces_rows(g, ke->root);
    if (s->kernels[t].n_red + ke->n_red > LOOM_IR_KERNEL_REDUCTIONS_MAX ||
        s->kernels[t].n_fused + ke->n_fused > LOOM_IR_KERNEL_NODES_MAX)
        return;
    bool staged = false; /* e reads a value of t (at its row) */
    for (int32_t m = 0; m < ke->n_members; m++) {
        int32_t u = s->members[ke->first_member + m];
        const loom_ir_node *un = &g->nodes[u];
        if (s->fn[u].pad_view)
            return;
        for (int32_t q = 0; q < un->n_inputs; q++) { /* directly or through a reshape */
            if (s->fn[loom_ir_view_base(g, un->inputs[q])].kernel != t)
                continue;
            if (!rows || !reads_row_value(s, t, u, q))
                return;
            staged = true;
        }
    }
    if (!staged && !sums)
        return;
    for (int32_t m = 0; m < ke->n_members; m++)
        s->fn[s->members[ke->first_member + m]].kernel = t;
    s->kernels[t].n_red += ke->n_red;
    s->kernels[t].n_fused += ke->n_fused;
    s->kernels[e].n_members = 0;
    s->kernels[e].final = -2; /* merged */
}

/* Rule 2 for ELEMENTWISE kernel e over the rows of REDUCTION kernel t (t reduces rows, e
 * loops over t's operand shape, t is the latest kernel e reads): e joins t as its last
 * stage when it reads t's values only at their rows (reads_row_value; e writes no graph
 * output of another shape, which it cannot: its space is its root's).
 * Codegen runs it over each row after the row's reductions: softmax's output
 * exp(x - max) / sum, layer norm's (x - mean) * rstd, softmax's backward y * (dy - sum),
 * the row read from memory once. */
static void try_row_stage(fuse_state *s, int32_t t, int32_t e) {
    const loom_ir_graph *g = s->g;
    const fkernel *ke = &s->kernels[e];
    for (int32_t m = 0; m < ke->n_members; m++) {
        int32_t u = s->members[ke->first_member + m];
        const loom_ir_node *un = &g->nodes[u];
        if (s->fn[u].pad_view)
            return;
        for (int32_t q = 0; q < un->n_inputs; q++)
            if (s->fn[loom_ir_view_base(g, un->inputs[q])].kernel == t &&
                !reads_row_value(s, t, u, q))
                return;
    }
    for (int32_t m = 0; m < ke->n_members; m++) {
        fnode *f = &s->fn[s->members[ke->first_member + m]];
        f->kernel = t;
        f->space = SPACE_IN; /* the reduced operand's shape: e's own */
    }
    s->kernels[t].n_fused += ke->n_fused;
    s->kernels[e].n_members = 0;
    s->kernels[e].final = -2; /* merged */
}

/* Rule 2 for ELEMENTWISE kernel e: merges it into a reduction or matmul when allowed, or
 * into the elementwise kernel before it. */
static void try_epilogue(fuse_state *s, int32_t e) {
    const loom_ir_graph *g = s->g;
    const fkernel *ke = &s->kernels[e];
    int32_t target = -1;
    bool target_via_view = false;
    /* the latest kernel whose values e reads; kernel roots order kernels */
    for (int32_t m = 0; m < ke->n_members; m++) {
        const loom_ir_node *un = &g->nodes[s->members[ke->first_member + m]];
        for (int32_t q = 0; q < un->n_inputs; q++) {
            int32_t o = un->inputs[q];
            if (s->fn[o].kernel == e || g->nodes[o].op == LOOM_IR_OP_CONSTANT)
                continue;
            int32_t b = loom_ir_view_base(g, o);
            if (g->nodes[b].op == LOOM_IR_OP_INPUT)
                continue;
            int32_t p = producer(s, b);
            if (p < 0)
                return; /* cannot happen in a well-formed partition; leave e alone */
            if (target < 0 || s->kernels[p].root > s->kernels[target].root) {
                target = p;
                target_via_view = b != o;
            } else if (p == target) {
                target_via_view = target_via_view || b != o;
            }
        }
    }
    if (target < 0 || target_via_view ||
        s->kernels[target].n_fused + ke->n_fused > LOOM_IR_KERNEL_NODES_MAX)
        return;
    const fkernel *kt = &s->kernels[target];
    bool sibling = kt->kind == LOOM_IR_KERNEL_ELEMENTWISE;
    if (kt->kind != LOOM_IR_KERNEL_REDUCTION && kt->kind != LOOM_IR_KERNEL_ROOTED &&
        !(sibling && sibling_ok(s, target, e)))
        return;
    const loom_ir_node *troot = &g->nodes[kt->root], *eroot = &g->nodes[ke->root];
    if (kt->kind == LOOM_IR_KERNEL_REDUCTION && reduces_rows(g, kt->root) &&
        loom_ir_same_shape(&g->nodes[troot->inputs[0]], eroot)) {
        try_row_stage(s, target, e);
        return;
    }
    if (troot->rank != eroot->rank ||
        memcmp(troot->shape, eroot->shape, (size_t)troot->rank * sizeof troot->shape[0]) != 0)
        return;
    /* A weight gradient's epilogue runs element by element in dw's order, reading C down
     * its columns: one that reads other full-size buffers too (an optimizer's update of the
     * weight and its state) ran 1.5-2x slower there than the elementwise kernel it saves. */
    bool gw = troot->op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT;
    int64_t numel = loom_ir_numel(troot->rank, troot->shape);
    for (int32_t m = 0; m < ke->n_members; m++) {
        int32_t u = s->members[ke->first_member + m];
        const loom_ir_node *un = &g->nodes[u];
        if (s->fn[u].pad_view)
            return; /* its operand must stay in a buffer */
        for (int32_t q = 0; q < un->n_inputs; q++) {
            int32_t o = un->inputs[q];
            const loom_ir_node *on = &g->nodes[o];
            if (gw && s->fn[o].kernel != target && s->fn[o].kernel != e &&
                on->op != LOOM_IR_OP_CONSTANT && loom_ir_numel(on->rank, on->shape) == numel)
                return;
            if (s->fn[o].kernel != target)
                continue;
            fmap map; /* a pad reads a buffer, which the epilogue's value never is */
            if (!operand_map(g, u, &s->fn[u].map, q, &map))
                return;
            if (s->fn[o].space != SPACE_OUT || !map_equal(&map, &s->fn[o].map))
                return;
            if (kt->kind == LOOM_IR_KERNEL_ROOTED)
                for (int32_t x = s->user_start[o]; x < s->user_start[o + 1]; x++) {
                    int32_t k = s->fn[s->users[x]].kernel;
                    if (k != target && k != e)
                        return;
                }
        }
    }
    for (int32_t m = 0; m < ke->n_members; m++)
        s->fn[s->members[ke->first_member + m]].kernel = target;
    s->kernels[target].n_fused += ke->n_fused;
    if (sibling) /* an elementwise kernel's root is its last node */
        s->kernels[target].root = ke->root;
    s->kernels[e].n_members = 0;
    s->kernels[e].final = -2; /* merged */
}

static int32_t *arena_copy(loom_ir_plan *plan, const int32_t *v, int32_t n) {
    int32_t *p = loom_ir_arena_alloc(&plan->arena, (size_t)(n > 0 ? n : 1) * sizeof *p);
    if (p && n > 0)
        memcpy(p, v, (size_t)n * sizeof *p);
    return p;
}

/* Rule 4: the plan's kernels from the fusion kernels in `order` (root order). */
static loom_status emit(fuse_state *s, const int32_t *order, int32_t n_live) {
    const loom_ir_graph *g = s->g;
    loom_ir_plan *plan = s->plan;
    if (!loom_ir_grow(&plan->alloc, (void **)&plan->kernels, &plan->cap_kernels, n_live,
                      sizeof *plan->kernels))
        return LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t j = 0; j < n_live; j++)
        s->kernels[order[j]].final = j;
    for (int32_t i = 0; i < g->n_nodes; i++)
        plan->node_kernel[i] = s->fn[i].kernel >= 0 ? s->kernels[s->fn[i].kernel].final : -1;

    /* the computed nodes of every kernel, bucketed in graph order */
    int32_t *start = s->kstart; /* n_live + 1 bucket bounds */
    for (int32_t j = 0; j <= n_live; j++)
        start[j] = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (plan->node_kernel[i] >= 0)
            start[plan->node_kernel[i] + 1]++;
    for (int32_t j = 0; j < n_live; j++)
        start[j + 1] += start[j];
    for (int32_t i = 0; i < g->n_nodes; i++)
        s->mark[i] = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        int32_t j = plan->node_kernel[i];
        if (j >= 0)
            s->members[start[j] + s->mark[j]++] = i;
    }

    /* marks per node: j while kernel j lists it as a node, -j - 2 while as an arg */
    for (int32_t i = 0; i < g->n_nodes; i++)
        s->mark[i] = -1;
    for (int32_t j = 0; j < n_live; j++) {
        const fkernel *fk = &s->kernels[order[j]];
        loom_ir_kernel *kn = &plan->kernels[j];
        *kn = (loom_ir_kernel){.kind = fk->kind,
                               .root = fk->root,
                               .wait_before = fk->kind == LOOM_IR_KERNEL_COLLECTIVE ? j + 1 : 0};
        const int32_t *mem = s->members + start[j];
        int32_t n_mem = start[j + 1] - start[j];
        int32_t c = fk->root;
        bool const_kernel = g->nodes[c].op == LOOM_IR_OP_CONSTANT;
        if (const_kernel) { /* rule 3: a constant written alone */
            mem = &c;
            n_mem = 1;
        }
        int32_t *list = s->list, *args = s->list + g->n_nodes, *res = s->list + 2 * g->n_nodes;
        int32_t n_list = 0, n_args = 0, n_res = 0;
        for (int32_t m = 0; m < n_mem; m++) {
            list[n_list++] = mem[m];
            s->mark[mem[m]] = j;
        }
        /* a matmul reads its operands from buffers, constants included, even when its
         * epilogue uses the same constant: mark those args first; so does a collective */
        for (int32_t m = 0; m < n_mem; m++) {
            const loom_ir_node *un = &g->nodes[mem[m]];
            if (!loom_ir_op_traits(un->op)->buffered)
                continue;
            for (int32_t q = 0; q < un->n_inputs; q++)
                if (s->mark[un->inputs[q]] != -j - 2 && s->mark[un->inputs[q]] != j) {
                    args[n_args++] = un->inputs[q];
                    s->mark[un->inputs[q]] = -j - 2;
                }
        }
        for (int32_t m = 0; m < n_mem; m++) {
            const loom_ir_node *un = &g->nodes[mem[m]];
            for (int32_t q = 0; q < un->n_inputs; q++) {
                int32_t o = un->inputs[q];
                if (s->mark[o] == j || s->mark[o] == -j - 2)
                    continue;
                if (g->nodes[o].op == LOOM_IR_OP_CONSTANT) {
                    list[n_list++] = o; /* rule 3: recomputed here */
                    s->mark[o] = j;
                } else {
                    args[n_args++] = o;
                    s->mark[o] = -j - 2;
                }
            }
        }
        for (int32_t m = 0; m < n_mem; m++) {
            int32_t x = mem[m];
            bool needed = s->is_output[x] || const_kernel || fk->kind == LOOM_IR_KERNEL_COLLECTIVE;
            for (int32_t e = s->user_start[x]; e < s->user_start[x + 1] && !needed; e++)
                needed = plan->node_kernel[s->users[e]] != j;
            if (needed)
                res[n_res++] = x;
        }
        qsort(list, (size_t)n_list, sizeof *list, loom_ir_cmp_i32);
        qsort(args, (size_t)n_args, sizeof *args, loom_ir_cmp_i32);
        kn->n_nodes = n_list;
        kn->n_args = n_args;
        kn->n_results = n_res;
        kn->nodes = arena_copy(plan, list, n_list);
        kn->args = arena_copy(plan, args, n_args);
        kn->results = arena_copy(plan, res, n_res);
        if (!kn->nodes || !kn->args || !kn->results)
            return LOOM_STATUS_OUT_OF_MEMORY;
    }
    plan->n_kernels = n_live;
    return LOOM_OK;
}

loom_status loom_pass_fuse(const loom_ir_graph *g, loom_ir_plan *plan, loom_ir_diag *d) {
    if (!g || !plan)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "fuse: %s is NULL",
                                !g ? "the graph" : "the plan");
    if (loom_ir_plan_reset(plan, g) != LOOM_OK)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "fuse: out of memory");
    int32_t n = g->n_nodes;
    if (n == 0)
        return LOOM_OK;
    int64_t n_edges = 0;
    for (int32_t i = 0; i < n; i++)
        n_edges += g->nodes[i].n_inputs;
    /* one scratch block: fn, kernels (at most one per node), the int arrays, is_output */
    size_t n_ints = (size_t)(n + 1) + (size_t)n_edges + 3 * (size_t)n + 3 * (size_t)n +
                    (size_t)(n + 1) + (size_t)n;
    size_t bytes = (size_t)n * (sizeof(fnode) + sizeof(fkernel)) + n_ints * sizeof(int32_t) +
                   (size_t)n * sizeof(bool);
    void *block = loom_ir_alloc(&plan->alloc, bytes);
    if (!block)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "fuse: out of memory");
    fuse_state s = {.g = g, .plan = plan};
    s.fn = block;
    s.kernels = (fkernel *)(s.fn + n);
    s.user_start = (int32_t *)(s.kernels + n);
    s.users = s.user_start + n + 1;
    s.ckernel = s.users + n_edges;
    s.members = s.ckernel + n;
    s.mark = s.members + n;
    s.list = s.mark + n;
    s.kstart = s.list + 3 * (size_t)n;
    s.order = s.kstart + n + 1;
    s.is_output = (bool *)(s.order + n);

    /* users of every node (CSR), outputs */
    for (int32_t i = 0; i <= n; i++)
        s.user_start[i] = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t q = 0; q < g->nodes[i].n_inputs; q++)
            s.user_start[g->nodes[i].inputs[q] + 1]++;
    for (int32_t i = 0; i < n; i++)
        s.user_start[i + 1] += s.user_start[i];
    for (int32_t i = 0; i < n; i++)
        s.mark[i] = s.user_start[i];
    for (int32_t i = 0; i < n; i++)
        for (int32_t q = 0; q < g->nodes[i].n_inputs; q++)
            s.users[s.mark[g->nodes[i].inputs[q]]++] = i;
    for (int32_t i = 0; i < n; i++) {
        s.is_output[i] = false;
        s.ckernel[i] = -1;
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        s.is_output[g->outputs[o].node] = true;

    group_producers(&s);

    /* phase-1 members of each kernel, and the kernels in root order */
    int32_t *order = s.order;
    for (int32_t k = 0; k < s.n_kernels; k++)
        s.kernels[k].n_members = 0;
    for (int32_t i = 0; i < n; i++)
        if (s.fn[i].kernel >= 0)
            s.kernels[s.fn[i].kernel].n_members++;
    for (int32_t k = 0, at = 0; k < s.n_kernels; k++) {
        s.kernels[k].first_member = at;
        at += s.kernels[k].n_members;
        s.kernels[k].n_members = 0;
    }
    for (int32_t i = 0; i < n; i++)
        if (s.fn[i].kernel >= 0) {
            fkernel *fk = &s.kernels[s.fn[i].kernel];
            s.members[fk->first_member + fk->n_members++] = i;
        }
    /* kernels were created from the last root to the first: reversed, they are in order */
    for (int32_t k = 0; k < s.n_kernels; k++)
        order[k] = s.n_kernels - 1 - k;

    for (int32_t j = 0; j < s.n_kernels; j++) {
        int32_t k = order[j];
        if (s.kernels[k].kind == LOOM_IR_KERNEL_ELEMENTWISE &&
            g->nodes[s.kernels[k].root].op != LOOM_IR_OP_CONSTANT &&
            g->nodes[s.kernels[k].root].op != LOOM_IR_OP_CONCAT)
            try_epilogue(&s, k);
        else if (s.kernels[k].kind == LOOM_IR_KERNEL_REDUCTION)
            try_reduction_sibling(&s, k);
    }
    int32_t n_live = 0;
    for (int32_t j = 0; j < s.n_kernels; j++)
        if (s.kernels[order[j]].final != -2)
            order[n_live++] = order[j];
    loom_status st = emit(&s, order, n_live);
    loom_ir_free(&plan->alloc, block, bytes);
    if (st != LOOM_OK) {
        plan->n_kernels = 0;
        return loom_ir_diag_set(d, st, "fuse: out of memory");
    }
    return LOOM_OK;
}
