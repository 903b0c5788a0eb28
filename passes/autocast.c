/* The autocast pass: turns the autocast tags the frontend recorded (attrs.autocast) into
 * casts, by each op's autocast class in ops.def, and clears the tags.
 *
 * The graph is rebuilt in order. Every node keeps its op, shape and attributes; what changes
 * is the dtype its operands arrive in, and so (by inference) its own dtype:
 *  - a tagged LOWER op (matmul) gets its f32/f16/bf16 operands in the tag's dtype, so its
 *    result has that dtype (f64 is never cast down: PyTorch's autocast leaves it alone);
 *  - a tagged ADD of a tagged LOWER result (through reshapes and transposes) and a BROADCAST
 *    is that op's bias (linear's, conv2d's): it runs in the tag's dtype too, as PyTorch's
 *    addmm and conv with bias do, instead of promoting to the bias's f32;
 *  - conv2d's gradients are LOWER ops like conv2d; the 16-bit input gradient's window sum
 *    in f32 (col2im, as oneDNN's bf16 backward accumulates) is passes/conv_decompose.c's;
 *  - a tagged FP32 op gets its 16-bit operands in f32;
 *  - a PROMOTE op (tagged or not: it is type promotion, which holds outside autocast too)
 *    whose float operands now differ gets them all in the widest (f16 with bf16: f32).
 *    Constants (through broadcasts and reshapes) take the dtype of the others instead of
 *    widening it, as Python scalars do in PyTorch: relu's backward, select(x > 0, dy, 0),
 *    stays in bf16 although its zeros were recorded f32;
 *  - a tagged sign test, x > 0 or x < 0 (relu's gradient mask), of an f32 x that already
 *    has a copy in the tag's dtype tests that copy (test_sign_on_copy);
 *  - a collective (tagged or not) gets its operand in the dtype it was recorded with: the
 *    all-reduce of an f32 parameter's gradient reduces f32 values across the ranks, as DDP
 *    does under autocast, even when the gradient now comes out of a bf16 matmul;
 *  - every other op takes its operands as they now are: relu of bf16 is bf16, a cast keeps
 *    its recorded target, sources keep their types; but operands that now differ are
 *    promoted as above whatever the op's class (a matmul with autocast off, fed by a bf16
 *    result and an f32 weight, runs in f32 instead of failing).
 * The graph's outputs are cast back to the dtypes they were recorded with, so what the user
 * sees (retained results, parameters and state written back, gradients) never changes type.
 *
 * A value is converted to a dtype at most once (memoized), and the conversion is placed at
 * the value's source: cast(transpose(w)) is built as transpose(cast(w)), through every
 * single-operand movement (broadcast, reshape, transpose, slice, pad) and into each operand
 * of a concat. So the forward's w and the backward's w^T share one cast of the parameter, a
 * bias is cast before it is broadcast, and im2col gathers 16-bit windows instead of casting
 * the whole column matrix. Casts commute exactly with data movement, so this changes no
 * value. */
#include <string.h>

#include "passes.h"

typedef struct ac_state {
    const loom_ir_graph *g; /* the tagged graph */
    loom_ir_graph out;
    int32_t *map;     /* g node -> out node */
    int32_t *memo;    /* out node * LOOM_DTYPE_COUNT_ + dtype -> that value in dtype, or -1 */
    int32_t cap_memo; /* entries, a multiple of LOOM_DTYPE_COUNT_ */
    int32_t *ops;     /* scratch operands, g's widest node */
    int32_t *stack;   /* convert's walk down data movement */
    int32_t cap_stack;
    loom_ir_diag *d;
    loom_status st;
} ac_state;

static bool is_castable(loom_dtype dt) {
    return dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_F16 || dt == LOOM_DTYPE_BF16;
}

static int32_t rank_of(loom_dtype dt) {
    switch (dt) {
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16: return 1;
    case LOOM_DTYPE_F32: return 2;
    case LOOM_DTYPE_F64: return 3;
    case LOOM_DTYPE_I32:
    case LOOM_DTYPE_I64:
    case LOOM_DTYPE_BOOL:
    case LOOM_DTYPE_COUNT_: break;
    }
    return 0;
}

/* The dtype two floats promote to (PyTorch: f16 with bf16 gives f32). */
static loom_dtype promote(loom_dtype a, loom_dtype b) {
    if (a == b)
        return a;
    int32_t ra = rank_of(a), rb = rank_of(b);
    if (ra == rb) /* f16 and bf16 */
        return LOOM_DTYPE_F32;
    return ra > rb ? a : b;
}

static int32_t emit(ac_state *s, const loom_ir_node_desc *desc) {
    if (s->st != LOOM_OK)
        return -1;
    int32_t id;
    if ((s->st = loom_ir_graph_add(&s->out, desc, &id, s->d)) != LOOM_OK)
        return -1;
    int32_t need = (id + 1) * LOOM_DTYPE_COUNT_;
    if (need > s->cap_memo) {
        int32_t old = s->cap_memo;
        if (!loom_ir_grow(&s->g->alloc, (void **)&s->memo, &s->cap_memo, need, sizeof *s->memo)) {
            s->st = loom_ir_diag_set(s->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
            return -1;
        }
        for (int32_t k = old; k < s->cap_memo; k++)
            s->memo[k] = -1;
    }
    return id;
}

/* Out node v in dtype dt if it is known: v itself, or an earlier conversion; -1 if not yet. */
static int32_t converted(const ac_state *s, int32_t v, loom_dtype dt) {
    if (s->out.nodes[v].dtype == dt)
        return v;
    return s->memo[v * LOOM_DTYPE_COUNT_ + dt];
}

/* Converts out node v, whose data-movement operands are all converted, or casts it. */
static int32_t convert_one(ac_state *s, int32_t v, loom_dtype dt) {
    loom_ir_node n = s->out.nodes[v]; /* a copy: the node array moves as nodes are added */
    int32_t r = -1;
    if (loom_ir_op_traits(n.op)->moves) {
        /* n.inputs is arena-owned and stays put; s->ops is the caller's, so use our own */
        int32_t small[16], *in = small;
        size_t bytes = (size_t)n.n_inputs * sizeof *in;
        if (n.n_inputs > 16 && !(in = loom_ir_alloc(&s->g->alloc, bytes))) {
            s->st = loom_ir_diag_set(s->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
            return -1;
        }
        for (int32_t k = 0; k < n.n_inputs; k++)
            in[k] = converted(s, n.inputs[k], dt);
        r = emit(s, &(loom_ir_node_desc){.op = n.op,
                                         .n_inputs = n.n_inputs,
                                         .inputs = in,
                                         .dtype = dt,
                                         .rank = n.rank,
                                         .shape = n.shape,
                                         .attrs = n.attrs,
                                         .loc = n.loc});
        if (in != small)
            loom_ir_free(&s->g->alloc, in, bytes);
    } else {
        r = emit(
            s, &(loom_ir_node_desc){
                   .op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = &v, .dtype = dt, .loc = n.loc});
    }
    if (r >= 0)
        s->memo[v * LOOM_DTYPE_COUNT_ + dt] = r;
    return r;
}

static bool push(ac_state *s, int32_t *top, int32_t x) {
    if (*top + 1 > s->cap_stack && !loom_ir_grow(&s->g->alloc, (void **)&s->stack, &s->cap_stack,
                                                 *top + 1, sizeof *s->stack)) {
        s->st = loom_ir_diag_set(s->d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        return false;
    }
    s->stack[(*top)++] = x;
    return true;
}

/* Out node v in dtype dt: v itself, an earlier conversion, or a new one placed at v's source
 * through data movement (see the file comment). -1 on failure. The walk down the movement
 * chain keeps its own stack: a chain of 100,000 transposes must not recurse that deep. */
static int32_t convert(ac_state *s, int32_t v, loom_dtype dt) {
    if (v < 0 || s->st != LOOM_OK)
        return -1;
    int32_t top = 0;
    if (converted(s, v, dt) < 0 && !push(s, &top, v))
        return -1;
    while (top > 0) {
        int32_t x = s->stack[top - 1];
        if (converted(s, x, dt) >= 0) {
            top--;
            continue;
        }
        bool ready = true;
        if (loom_ir_op_traits(s->out.nodes[x].op)->moves)
            /* pushed last to first, so the first operand converts first, as a recursion's */
            for (int32_t k = s->out.nodes[x].n_inputs - 1; k >= 0; k--) {
                int32_t in = s->out.nodes[x].inputs[k];
                if (in < 0)
                    return -1;
                if (converted(s, in, dt) < 0) {
                    ready = false;
                    if (!push(s, &top, in))
                        return -1;
                }
            }
        if (ready && convert_one(s, x, dt) < 0)
            return -1;
    }
    return converted(s, v, dt);
}

/* Whether g node x is, through reshapes and transposes, the result of a LOWER op tagged tag. */
static bool is_lower_result(const loom_ir_graph *g, int32_t x, loom_dtype tag) {
    while (g->nodes[x].op == LOOM_IR_OP_RESHAPE || g->nodes[x].op == LOOM_IR_OP_TRANSPOSE)
        x = g->nodes[x].inputs[0];
    return loom_ir_op_table[g->nodes[x].op].autocast == LOOM_IR_AC_LOWER &&
           g->nodes[x].attrs.autocast == tag;
}

/* Whether g node x is a constant fill, through broadcasts and reshapes. */
static bool is_fill(const loom_ir_graph *g, int32_t x) {
    while (g->nodes[x].op == LOOM_IR_OP_BROADCAST || g->nodes[x].op == LOOM_IR_OP_RESHAPE)
        x = g->nodes[x].inputs[0];
    return g->nodes[x].op == LOOM_IR_OP_CONSTANT;
}

/* Whether g node x is a fill of exact zeros, through broadcasts and reshapes. */
static bool is_zero_fill(const loom_ir_graph *g, int32_t x) {
    while (g->nodes[x].op == LOOM_IR_OP_BROADCAST || g->nodes[x].op == LOOM_IR_OP_RESHAPE)
        x = g->nodes[x].inputs[0];
    return g->nodes[x].op == LOOM_IR_OP_CONSTANT && g->nodes[x].attrs.value == 0;
}

/* A tagged sign test, x > 0 or x < 0 (relu's gradient mask), of an f32 x that already has
 * a copy in the tag's dtype (the next layer's 16-bit operand) tests the copy, as PyTorch's
 * autocast, whose relu runs on 16-bit values, does: rounding keeps every sign but that of
 * magnitudes below the 16-bit type's smallest subnormal. The backward then needs no f32
 * copy of the activation (ResNet's residual sums). Sets ops[k] for that operand. */
static void test_sign_on_copy(ac_state *s, int32_t i, int32_t *ops) {
    const loom_ir_node *n = &s->g->nodes[i];
    loom_dtype tag = n->attrs.autocast;
    if ((n->op != LOOM_IR_OP_GT && n->op != LOOM_IR_OP_LT) ||
        (tag != LOOM_DTYPE_BF16 && tag != LOOM_DTYPE_F16))
        return;
    for (int32_t k = 0; k < 2; k++) {
        int32_t x = ops[k];
        if (s->out.nodes[x].dtype == LOOM_DTYPE_F32 && is_zero_fill(s->g, n->inputs[1 - k]) &&
            s->memo[x * LOOM_DTYPE_COUNT_ + tag] >= 0)
            ops[k] = s->memo[x * LOOM_DTYPE_COUNT_ + tag];
    }
}

/* The dtype operand k of g node i must arrive in, given the dtypes its operands now have
 * (out nodes ops[]): LOOM_DTYPE_COUNT_ for "as it is". */
static loom_dtype wanted(const ac_state *s, int32_t i, int32_t k, const int32_t *ops) {
    const loom_ir_graph *g = s->g;
    const loom_ir_node *n = &g->nodes[i];
    loom_dtype tag = n->attrs.autocast, have = s->out.nodes[ops[k]].dtype;
    const loom_ir_op_info *info = &loom_ir_op_table[n->op];
    bool tagged = tag != LOOM_DTYPE_F32;
    if (tagged && info->autocast == LOOM_IR_AC_LOWER)
        return is_castable(have) ? tag : LOOM_DTYPE_COUNT_;
    if (tagged && info->autocast == LOOM_IR_AC_FP32)
        return have == LOOM_DTYPE_F16 || have == LOOM_DTYPE_BF16 ? LOOM_DTYPE_F32
                                                                 : LOOM_DTYPE_COUNT_;
    if (loom_ir_kind_table[info->kind].ranks) /* across ranks in the dtype recorded */
        return is_castable(have) && is_castable(n->dtype) ? n->dtype : LOOM_DTYPE_COUNT_;
    int32_t first =
        loom_ir_kind_table[info->kind].cond_first ? 1 : 0; /* select's condition is bool */
    if (k < first || !loom_ir_dtype_is_float(have))
        return LOOM_DTYPE_COUNT_;
    if (tagged && n->op == LOOM_IR_OP_ADD && n->n_inputs == 2) { /* a lower op's bias */
        int32_t a = n->inputs[0], b = n->inputs[1];
        if ((is_lower_result(g, a, tag) && g->nodes[b].op == LOOM_IR_OP_BROADCAST) ||
            (is_lower_result(g, b, tag) && g->nodes[a].op == LOOM_IR_OP_BROADCAST))
            return is_castable(have) ? tag : LOOM_DTYPE_COUNT_;
    }
    /* the widest of the operands that are not fills; of all when every one is */
    loom_dtype w = LOOM_DTYPE_COUNT_;
    for (int pass = 0; pass < 2 && w == LOOM_DTYPE_COUNT_; pass++)
        for (int32_t j = first; j < n->n_inputs; j++)
            if (pass == 1 || !is_fill(g, n->inputs[j])) {
                loom_dtype dj = s->out.nodes[ops[j]].dtype;
                w = w == LOOM_DTYPE_COUNT_ ? dj : promote(w, dj);
            }
    return w;
}

static bool any_tag(const loom_ir_graph *g) {
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].attrs.autocast != LOOM_DTYPE_F32)
            return true;
    return false;
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    if (!any_tag(g))
        return LOOM_OK;
    int32_t widest = 1;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].n_inputs > widest)
            widest = g->nodes[i].n_inputs;
    ac_state s = {.g = g, .d = d, .st = LOOM_OK};
    loom_ir_graph_init(&s.out, &g->alloc);
    size_t map_bytes = (size_t)g->n_nodes * sizeof *s.map,
           ops_bytes = (size_t)widest * sizeof *s.ops;
    s.map = loom_ir_alloc(&g->alloc, map_bytes);
    s.ops = loom_ir_alloc(&g->alloc, ops_bytes);
    if (!s.map || !s.ops)
        s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++)
            s.ops[k] = s.map[n->inputs[k]];
        test_sign_on_copy(&s, i, s.ops);
        /* Operands are converted one by one: converting one never changes what the next
         * wants (a promotion's widest dtype stays the widest once an operand has it). */
        for (int32_t k = 0; k < n->n_inputs && s.st == LOOM_OK; k++) {
            loom_dtype w = wanted(&s, i, k, s.ops);
            if (w != LOOM_DTYPE_COUNT_)
                s.ops[k] = convert(&s, s.ops[k], w);
        }
        loom_ir_attrs attrs = n->attrs;
        attrs.autocast = LOOM_DTYPE_F32;
        s.map[i] = emit(&s, &(loom_ir_node_desc){.op = n->op,
                                                 .n_inputs = n->n_inputs,
                                                 .inputs = s.ops,
                                                 .dtype = n->dtype,
                                                 .rank = n->rank,
                                                 .shape = n->shape,
                                                 .attrs = attrs,
                                                 .loc = n->loc});
    }
    for (int32_t o = 0; o < g->n_outputs && s.st == LOOM_OK; o++) {
        int32_t v = convert(&s, s.map[g->outputs[o].node], g->nodes[g->outputs[o].node].dtype);
        if (v >= 0 && loom_ir_graph_add_output(&s.out, v, g->outputs[o].alias) != LOOM_OK)
            s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    loom_ir_free(&g->alloc, s.map, map_bytes);
    loom_ir_free(&g->alloc, s.ops, ops_bytes);
    loom_ir_free(&g->alloc, s.memo, (size_t)s.cap_memo * sizeof *s.memo);
    loom_ir_free(&g->alloc, s.stack, (size_t)s.cap_stack * sizeof *s.stack);
    return loom_pass_replace_graph(g, &s.out, s.st, out_changed);
}

const loom_pass loom_pass_autocast = {"autocast", run};
