/* Lowering of scatter_add kernels (ops.def): the root of a ROOTED kernel whose operands (base,
 * idx, src) are read from buffers, with the root's fused elementwise epilogue. (A gather is a
 * loop op, evaluated in its reader's kernel: lower_eval.c.)
 *
 * A task is one index `o` of the axes before the scatter's axis and a block of columns of
 * the axes after it, or (where o takes few values and src is short along the axis: an
 * embedding's gradient) a block of rows along the axis: its part of the result, [o, :, block]
 * or [o, rows, :], is written by no other task. Its sums start from base, src's elements
 * are added in order at their clamped indices (a block of rows reads all of src and adds
 * those that fall into it), and then the epilogue runs on each element. The sums
 * are kept in the compute type (f32 for 16-bit dtypes, rounded once at the end): in the root's
 * own result buffer where the root is stored in a dtype that is its compute type, else in
 * scratch of one task's part. */
#include "lower_internal.h"

enum {
    SC_TASKS_MIN = 16, /* tasks wanted at least, splitting the inner columns when needed */
    SC_COLS_MIN = 64,  /* columns per task at least */
};

typedef struct sc_plan {
    loom_dtype dt;
    int32_t axis;
    int64_t outer, len, inner, J;
    bool in_place;  /* the sums in the root's result buffer */
    bool row_split; /* tasks take blocks of rows along the axis (in place only) */
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns;
} sc_plan;

static loom_status plan_scatter(kc *c, sc_plan *sp) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    int32_t a = (int32_t)root->attrs.index;
    if (root->n_inputs != 3 || a < 0 || a >= root->rank)
        return cg_bad_plan(c, c->k->root, "a scatter_add without base, indices and src");
    for (int32_t q = 0; q < 3; q++)
        if (c->s->buf_of[root->inputs[q]] < 0)
            return cg_unsupported(c, root->inputs[q],
                                  "a scatter_add operand computed inside its kernel (its "
                                  "operands are read from buffers)");
    sp->dt = root->dtype;
    sp->axis = a;
    sp->outer = loom_ir_numel(a, root->shape);
    sp->len = root->shape[a];
    sp->inner = loom_ir_numel(root->rank - a - 1, root->shape + a + 1);
    sp->J = g->nodes[root->inputs[1]].shape[a];
    sp->in_place = c->s->res_of[c->k->root] >= 0 && !is_16(sp->dt) && sp->dt != LOOM_DTYPE_BOOL;
    return cg_plan_epilogue(c, &sp->ns, sp->epi, &sp->n_epi, -1);
}

/* The epilogue at the root's element (outer index o, index l along the scatter's axis,
 * inner index i): no division where o and i are one axis each (an embedding's gradient),
 * where splitting a flat index cost two per element. */
static loom_status epilogue_at(kc *c, const sc_plan *sp, MlirValue v, MlirValue o, MlirValue l,
                               MlirValue i) {
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    c->ns = &sp->ns;
    cg_clear_gv(c);
    cg_set_dims(c, root, 0, sp->axis, o);
    cg_set_dims(c, root, sp->axis, sp->axis + 1, l);
    cg_set_dims(c, root, sp->axis + 1, root->rank, i);
    c->bound_v = is_16(sp->dt) ? cg_round16(c->b, sp->dt, v) : v;
    return cg_emit_sinks(c, sp->n_epi, sp->epi);
}

/* Where the sum of the root's element (o's part at p0, l along the axis, inner index i) is:
 * in the root's buffer in place, else in the task's scratch of len x cols. */
static MlirValue acc_at(cg_b *b, const sc_plan *sp, MlirValue p0, MlirValue l, MlirValue i,
                        MlirValue i0, int64_t cols) {
    if (sp->in_place)
        return cg_iadd(b, p0, cg_iadd(b, cg_imul_c(b, l, sp->inner), i));
    return cg_iadd(b, cg_imul_c(b, l, cols), cg_bin(b, "arith.subi", i, i0));
}

/* The loop over a task's columns [i0, i1), or none where the inner axes are one element (a
 * scatter along the last axis: cross-entropy's gradient), so that the loop over the axis is
 * innermost and contiguous for the vectorizer: with a loop of one column inside it, the
 * gradient's [256, 50257] took 8.7 ms in f32 and 24 ms stored as bf16. The column index. */
static MlirValue cols_begin(cg_b *b, const sc_plan *sp, cg_for *l, MlirValue i0, MlirValue i1) {
    if (sp->inner == 1)
        return i0;
    cg_for_begin(b, l, i0, i1, 0, NULL);
    return l->iv;
}

static void cols_end(cg_b *b, const sc_plan *sp, cg_for *l) {
    if (sp->inner != 1)
        cg_for_end(b, l, 0, NULL);
}

/* The address of buffer m's data. */
static MlirValue buf_addr(cg_b *b, MlirValue m) {
    MlirType t = b->index;
    return mlirOperationGetResult(
        cg_op(b, "memref.extract_aligned_pointer_as_index", 1, &m, 1, &t, 0, NULL), 0);
}

/* Task (o, rows [l0, l1) along the axis, columns [i0, i1) of the inner axes, at most cols):
 * base's part into the sums, src's elements added (those of the task's rows where it takes
 * a block of them), the epilogue on each sum. */
static loom_status emit_task(kc *c, const sc_plan *sp, MlirValue o, MlirValue l0, MlirValue l1,
                             MlirValue i0, MlirValue i1, int64_t cols, const MlirValue *args,
                             MlirValue acc) {
    cg_b *b = c->b;
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    const loom_ir_node *idx = &c->g->nodes[root->inputs[1]];
    bool fl = loom_ir_dtype_is_float(sp->dt);
    MlirValue p0 = cg_imul_c(b, o, sp->len * sp->inner), s0 = cg_imul_c(b, o, sp->J * sp->inner);
    cg_for ll, lj, li;
    /* the sums in the base's own buffer (memory planning gave the result the block of a base
     * that dies here: loom_ir_plan_scatter_base) start there as they are */
    cg_if copy;
    if (sp->in_place)
        cg_if_begin(b, &copy, cg_cmpi(b, CG_I_NE, buf_addr(b, args[0]), buf_addr(b, acc)));
    cg_for_begin(b, &ll, l0, l1, 0, NULL);
    MlirValue row = cg_iadd(b, p0, cg_imul_c(b, ll.iv, sp->inner));
    MlirValue i = cols_begin(b, sp, &li, i0, i1);
    cg_store(b, cg_load_val(b, sp->dt, args[0], cg_iadd(b, row, i)), acc,
             acc_at(b, sp, p0, ll.iv, i, i0, cols));
    cols_end(b, sp, &li);
    cg_for_end(b, &ll, 0, NULL);
    if (sp->in_place)
        cg_if_end(b, &copy);
    cg_for_begin(b, &lj, cg_idx(b, 0), cg_idx(b, sp->J), 0, NULL);
    MlirValue srow = cg_iadd(b, s0, cg_imul_c(b, lj.iv, sp->inner));
    i = cols_begin(b, sp, &li, i0, i1);
    MlirValue e = cg_iadd(b, srow, i);
    MlirValue t = index_clamped(b, cg_load_val(b, idx->dtype, args[1], e), sp->len);
    cg_if in_rows;
    if (sp->row_split)
        cg_if_begin(b, &in_rows,
                    and_i1(b, cg_cmpi(b, CG_I_SGE, t, l0), cg_cmpi(b, CG_I_SLT, t, l1)));
    MlirValue to = acc_at(b, sp, p0, t, i, i0, cols);
    MlirValue sum = cg_bin(b, fl ? "arith.addf" : "arith.addi", cg_load(b, acc, to),
                           cg_load_val(b, sp->dt, args[2], e));
    cg_store(b, sum, acc, to);
    if (sp->row_split)
        cg_if_end(b, &in_rows);
    cols_end(b, sp, &li);
    cg_for_end(b, &lj, 0, NULL);
    loom_status st = LOOM_OK;
    if (sp->in_place && sp->n_epi == 1 && sp->epi[0].node == c->k->root)
        return st; /* the sums are the result, nothing else to compute */
    cg_for_begin(b, &ll, l0, l1, 0, NULL);
    i = cols_begin(b, sp, &li, i0, i1);
    MlirValue v = cg_load(b, acc, acc_at(b, sp, p0, ll.iv, i, i0, cols));
    st = epilogue_at(c, sp, v, o, ll.iv, i);
    cols_end(b, sp, &li);
    cg_for_end(b, &ll, 0, NULL);
    return st;
}

loom_status cg_lower_scatter(kc *c) {
    sc_plan *sp = loom_ir_alloc(&c->s->alloc, sizeof *sp);
    if (!sp)
        return cg_oom(c);
    memset(sp, 0, sizeof *sp);
    loom_status st = plan_scatter(c, sp);
    if (st != LOOM_OK)
        goto done;
    /* few outer indices (an embedding's gradient has one): the rows along the axis split
     * where src is short along it (each block of rows reads all of src), else the inner
     * columns, each block written by its task alone. GPT-2's wte gradient [50257, 256] from
     * 256 tokens in blocks of 16 columns walked all 51 MB in each of 16 tasks, a 64-byte
     * run per row: 10 ms on an Intel Xeon (AVX-512) */
    int64_t nib = 1, nlb = 1;
    if (sp->outer < SC_TASKS_MIN && sp->in_place && sp->J * SC_TASKS_MIN <= sp->len) {
        nlb = (SC_TASKS_MIN + sp->outer - 1) / (sp->outer > 0 ? sp->outer : 1);
        sp->row_split = true;
    } else if (sp->outer < SC_TASKS_MIN && sp->inner >= 2 * SC_COLS_MIN) {
        nib = (SC_TASKS_MIN + sp->outer - 1) / (sp->outer > 0 ? sp->outer : 1);
        nib = nib > sp->inner / SC_COLS_MIN ? sp->inner / SC_COLS_MIN : nib;
    }
    int64_t cols = (sp->inner + nib - 1) / nib, rows = (sp->len + nlb - 1) / nlb;
    c->extent = sp->outer > 0 ? sp->outer * nib * nlb : 1;
    c->grain = cg_grain_for(rows * cols + sp->J * cols);
    if (!c->emit || sp->outer * sp->len * sp->inner == 0)
        goto done;
    cg_b *b = c->b;
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    MlirValue args[3];
    for (int32_t q = 0; q < 3; q++)
        args[q] = c->bufs[c->s->buf_of[root->inputs[q]]];
    /* scratch for one task's part, reused by the call's tasks (a whole-kernel buffer was
     * zero-filled by the OS page by page in every call: 154 MB for GPT-2's wte gradient) */
    MlirValue acc = sp->in_place ? c->bufs[c->s->res_of[c->k->root]]
                                 : cg_alloc_buf(b, cg_compute_type(b, sp->dt), sp->len * cols);
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    int64_t nb = nib * nlb; /* blocks per outer index: of columns or of rows */
    MlirValue o = nb > 1 ? cg_bin(b, "arith.divui", lo.iv, cg_idx(b, nb)) : lo.iv;
    MlirValue blk = nb > 1 ? cg_bin(b, "arith.remui", lo.iv, cg_idx(b, nb)) : cg_idx(b, 0);
    MlirValue i0 = cg_imul_c(b, nib > 1 ? blk : cg_idx(b, 0), cols);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, cols)), cg_idx(b, sp->inner));
    MlirValue l0 = cg_imul_c(b, nlb > 1 ? blk : cg_idx(b, 0), rows);
    MlirValue l1 = cg_imin(b, cg_iadd(b, l0, cg_idx(b, rows)), cg_idx(b, sp->len));
    st = emit_task(c, sp, o, l0, l1, i0, i1, cols, args, acc);
    cg_for_end(b, &lo, 0, NULL);
    if (!sp->in_place)
        cg_op(b, "memref.dealloc", 1, &acc, 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, sp, sizeof *sp);
    return st;
}
