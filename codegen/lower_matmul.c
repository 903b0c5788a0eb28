/* Lowering of MATMUL kernels: tasks over (batch, row block, column block), the product as
 * plain loops or a linalg.matmul for the matmul schedule, then the fused epilogue. */
#include <string.h>

#include <mlir-c/Dialect/Linalg.h>

#include "lower_internal.h"

enum {
    MM_ROWS_MIN = 32,       /* output rows per matmul task: at least (unless M is smaller) */
    MM_ROWS_MAX = 128,      /* and at most (B streams once per block: bigger blocks reuse it) */
    MM_TASKS_MIN = 16,      /* fewer (batch, row block) tasks than this: split the columns too */
    MM_COLS_MIN = 256,      /* columns per matmul task: at least (the schedule's cache tile Nc) */
    MM_WIDE_N = 4096,       /* N from which columns are split (below: slower, the MLP's 512 15%) */
    MM_WIDE_ROWS_MAX = 512, /* rows per task when columns are split (the schedule's Mc max) */
    MM_B_STREAMS = 1 << 20, /* elements of B (4 MB of f32) above which B streams from memory */
    MM_B_STREAM_BLOCKS = 4, /* then rows in this many blocks at most */
    MK_B_STREAM_BLOCKS = 2, /* (packed kinds whose columns split into tasks) */
    MK_COLS_MIN = 64,       /* packed kinds: columns per task at least */
    MK_SPLIT_BELOW = 4,     /* packed kinds: columns split into tasks below this many row blocks */
    /* into this many tasks where K is long (K > MK_KCHUNK_FROM), as each column block packs
     * all of A's long rows: GPT-2's lm_head input gradient [256, 50257] x [50257, 256] on a
     * Zen 3 (AVX2 tiles, 2 threads, LOOM_PROFILE) ran at 62-75 GFLOP/s in 8 tasks of 128 x
     * 64, 92-105 in 4, 133-135 in 2 of 128 x 256 */
    MK_LONG_K_TASKS = 2,
    MM_PACK_F32_ROWS = 256,     /* f32 matmuls pack for the microkernel from these many rows */
    MM_PACK_F32_MACS = 1 << 29, /* and multiply-adds (512 x 1024 x 1024) */
    MK_KCHUNK_FROM = 4096,      /* packed kinds: K above this is taken in chunks */
    MK_KCHUNK = 512,            /* of this many (even: bf16 pairs never straddle two) */
    /* packed kinds with N >= MM_WIDE_N: a task's C block at most this many bytes. Its f32
     * scratch is written by the microkernel and read back by the epilogue; in 8 tasks of
     * 6336 columns (6.5 MB for 256 rows) both went to memory. On a Zen 4 (2 threads,
     * bench_gemm --dtype bf16; f32 / bf16 GFLOP/s): 256 x 50257 x 256 158 -> 187 /
     * 287 -> 322, 2048 x 4096 x 512 106 -> 172 / 204 -> 274; loom-ir run of GPT-2's
     * lm_head x @ wte^T 45.5 -> 36.3 ms. 512 KB and 1 MB blocks were slower. */
    MK_C_BYTES = 256 << 10,
};

/* How the product is computed: PLAIN reads the operands from their buffers (f32, f64,
 * integers); 16-bit matmuls pack each task's operands first, evaluating them (so a cast
 * into the matmul costs no pass of its own), for the packed microkernel (cg_mk_tiles).
 * So do large f32 matmuls on AVX-512 and AVX2 hosts (loom_cg_f32_microkernel), where B streams from
 * memory (K x N >= MM_B_STREAMS) and M x K x N >= MM_PACK_F32_MACS with M >= 256. Measured
 * on a Zen 4 (bench_gemm --dtype bf16, its "Loom f32" column; GFLOP/s on 1 and 2 threads,
 * microkernel against the matmul schedule's cache tiles): 1024^3 107-109 / 207-208 against
 * 99-101 / 200-204, 2048^3 109 / 208-212 against 97-98 / 199-202, 256 x 2048 x 2048 96-97 /
 * 163-170 against 78 / 149-155, 512 x 1024 x 1024 103-107 / 200-204 against 93-98 /
 * 188-208; but 256 x 1024 x 1024 on 2 threads 188-196 against 213-214, and 512^3 and the
 * MLP's layers stay as fast or faster on the schedule (the MLP's 64-row ones 112 against
 * 95). */
typedef enum mm_kind { MM_PLAIN, MM_PACK_F32, MM_PACK_BF16 } mm_kind;

static mm_kind mm_kind_of(loom_dtype dt, int64_t M, int64_t K, int64_t N) {
    /* M x K x N >= MACS, as a division: the product of three dims may overflow */
    if (dt == LOOM_DTYPE_F32 && M >= MM_PACK_F32_ROWS && K * N >= MM_B_STREAMS &&
        M >= ceil_div(MM_PACK_F32_MACS, K * N) && loom_cg_f32_microkernel())
        return MM_PACK_F32;
    if (!is_16(dt))
        return MM_PLAIN;
    return cg_mk_pairs(dt) ? MM_PACK_BF16 : MM_PACK_F32;
}

/* ---- MATMUL ------------------------------------------------------------------------------- */

typedef struct mm_plan {
    int64_t P, M, K, N, nbm, rows, nbn, cols;
    int64_t kc;      /* packed kinds: K per chunk (K: one chunk) */
    int64_t cstride; /* elements between rows of C: N, or cols in the scratch block */
    loom_dtype dt;
    MlirType acc_t;
    int32_t acc_res; /* result node whose buffer holds the products, -1: scratch */
    sink epi[CG_EPI_MAX];
    int32_t n_epi;
    nest ns; /* the root's dims, one group per dim */
    bool linalg;
    mm_kind kind;
    nest ons[2]; /* packed kinds: the operands' dims, one group per dim */
    int64_t mbp; /* packed kinds: rows of a task padded to the tile's */
    cg_mk mk;    /* packed kinds: the microkernel's tile and packing */
} mm_plan;

/* Whether a packed kind's N columns split into tasks when its row blocks are few
 * (MK_SPLIT_BELOW). */
static bool mk_cols_split(mm_kind kind, int64_t N) {
    return kind != MM_PLAIN && N >= 2 * MK_COLS_MIN;
}

static bool mm_linalg_ok(const loom_ir_node *root, int64_t M, int64_t K, int64_t N) {
    return root->dtype == LOOM_DTYPE_F32 && M >= 8 && K >= 8 && N >= 8;
}

/* Columns per task for a matmul of N columns whose (batch, row block) tasks number tasks:
 * N unless the tasks are too few to share among threads. */
static int64_t mm_cols(int64_t tasks, int64_t N) {
    if (tasks >= MM_TASKS_MIN || N < MM_WIDE_N)
        return N > 0 ? N : 1;
    int64_t nbn = ceil_div(MM_TASKS_MIN, tasks);
    if (nbn > N / MM_COLS_MIN)
        nbn = N / MM_COLS_MIN;
    int64_t start = ceil_div(ceil_div(N, nbn), 16) * 16;
    /* a divisor of N (no remainder block: one static linalg.matmul instead of two) */
    for (int64_t c = start; c >= start / 2 && c >= MM_COLS_MIN; c -= 16)
        if (N % c == 0)
            return c;
    return ceil_div(start, 64) * 64 < N ? ceil_div(start, 64) * 64 : N;
}

/* A rows x cols view of flat at off whose rows are stride elements apart. */
static MlirValue view2d(cg_b *b, MlirValue flat, MlirValue off, int64_t rows, int64_t cols,
                        int64_t stride) {
    int64_t strides[2] = {stride, 1}, shape[2] = {rows, cols};
    MlirAttribute layout =
        mlirStridedLayoutAttrGet(b->ctx, mlirShapedTypeGetDynamicStrideOrOffset(), 2, strides);
    MlirType elem = mlirShapedTypeGetElementType(mlirValueGetType(flat));
    MlirType t = mlirMemRefTypeGet(elem, 2, shape, layout, mlirAttributeGetNull());
    int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset();
    MlirNamedAttribute attrs[4] = {
        cg_named(b, "operandSegmentSizes",
                 mlirDenseI32ArrayGet(b->ctx, 4, (int32_t[]){1, 1, 0, 0})),
        cg_named(b, "static_offsets", mlirDenseI64ArrayGet(b->ctx, 1, &dyn)),
        cg_named(b, "static_sizes", mlirDenseI64ArrayGet(b->ctx, 2, shape)),
        cg_named(b, "static_strides", mlirDenseI64ArrayGet(b->ctx, 2, strides)),
    };
    MlirValue ops[2] = {flat, off};
    return mlirOperationGetResult(cg_op(b, "memref.reinterpret_cast", 2, ops, 1, &t, 4, attrs), 0);
}

/* A named linalg op on memrefs (no results), its body region filled by MLIR. */
static void linalg_named(cg_b *b, const char *name, int32_t n_in, const MlirValue *ops,
                         int32_t n_ops) {
    MlirNamedAttribute seg = cg_named(
        b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){n_in, n_ops - n_in}));
    MlirRegion region = mlirRegionCreate();
    MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), b->loc);
    mlirOperationStateAddOperands(&st, n_ops, ops);
    mlirOperationStateAddAttributes(&st, 1, &seg);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    MlirOperation op = mlirOperationCreate(&st);
    mlirLinalgFillBuiltinNamedOpRegion(op);
    mlirBlockAppendOwnedOperation(b->block, op);
}

/* C[rows i0..i0+mb, cols j0..j0+nb) = A x B for one block, with static shapes (linalg
 * path); crow0 is the block's first element in C. */
static void emit_mm_block_linalg(kc *c, const mm_plan *mp, MlirValue a, MlirValue bm, MlirValue cm,
                                 MlirValue p, MlirValue i0, MlirValue j0, MlirValue crow0,
                                 int64_t mb, int64_t nb) {
    cg_b *b = c->b;
    MlirValue aoff = cg_imul_c(b, cg_iadd(b, cg_imul_c(b, p, mp->M), i0), mp->K);
    MlirValue boff = cg_iadd(b, cg_imul_c(b, p, mp->K * mp->N), j0);
    MlirValue av = view2d(b, a, aoff, mb, mp->K, mp->K);
    MlirValue bv = view2d(b, bm, boff, mp->K, nb, mp->N);
    MlirValue cv = view2d(b, cm, crow0, mb, nb, mp->cstride);
    MlirValue fill[2] = {cg_cf(b, b->f32, 0.0), cv};
    linalg_named(b, "linalg.fill", 1, fill, 2);
    MlirValue mm[3] = {av, bv, cv};
    linalg_named(b, "linalg.matmul", 2, mm, 3);
}

/* The linalg block for a task's rows (full or the last, shorter block), nb columns. */
static void emit_mm_rows_linalg(kc *c, const mm_plan *mp, MlirValue a, MlirValue bm, MlirValue cm,
                                MlirValue p, MlirValue ib, MlirValue i0, MlirValue j0,
                                MlirValue crow0, int64_t nb) {
    cg_b *b = c->b;
    int64_t full = mp->M / mp->rows, rem = mp->M % mp->rows;
    if (!rem) {
        emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, mp->rows, nb);
        return;
    }
    cg_if f;
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_ULT, ib, cg_idx(b, full)));
    emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, mp->rows, nb);
    cg_if_end(b, &f);
    cg_if_begin(b, &f, cg_cmpi(b, CG_I_EQ, ib, cg_idx(b, full)));
    emit_mm_block_linalg(c, mp, a, bm, cm, p, i0, j0, crow0, rem, nb);
    cg_if_end(b, &f);
}

/* Operand q (0: A, 1: B) at (row, col) of its last two axes and batch p, in f32 (rounded
 * to the matmul's 16-bit dtype, as its producers store it), in the operand's nest. */
static loom_status eval_operand(kc *c, const mm_plan *mp, int32_t q, MlirValue p, MlirValue row,
                                MlirValue col, MlirValue *out) {
    const loom_ir_node *root = &c->g->nodes[c->k->root];
    const nest *ns = &mp->ons[q];
    int32_t r = ns->n_dims;
    c->ns = ns;
    cg_clear_gv(c);
    int32_t bgroups[R], nbg = 0;
    for (int32_t d = 0; d < r - 2; d++)
        if (ns->dim_group[d] >= 0)
            bgroups[nbg++] = ns->dim_group[d];
    if (nbg > 0)
        cg_delinearize(c, p, nbg, bgroups);
    if (ns->dim_group[r - 2] >= 0)
        c->gv[ns->dim_group[r - 2]] = row;
    if (ns->dim_group[r - 1] >= 0)
        c->gv[ns->dim_group[r - 1]] = col;
    imap map;
    cg_identity_map(ns, &map);
    int32_t mark = cg_memo_mark(c);
    loom_status st = cg_eval(c, root->inputs[q], &map, out);
    cg_memo_pop(c, mark);
    return st;
}

/* The packed element 0 (i32 pairs of bf16, or f32). */
static MlirValue pack_zero(cg_b *b, const mm_plan *mp) {
    return mp->mk.pk == 2 ? cg_ci(b, b->i32, 0) : cg_cf(b, b->f32, 0.0);
}

/* Stores zero at buf[i * stride + j] for i in [i_lo, i_hi), j in [j_lo, j_hi) (pads). */
static void zero_fill(cg_b *b, MlirValue zero, MlirValue buf, MlirValue i_lo, MlirValue i_hi,
                      int64_t stride, MlirValue j_lo, MlirValue j_hi) {
    cg_for li;
    cg_for_begin(b, &li, i_lo, i_hi, 0, NULL);
    MlirValue row = cg_imul_c(b, li.iv, stride);
    cg_zero_range(b, buf, cg_iadd(b, row, j_lo), cg_bin(b, "arith.subi", j_hi, j_lo), zero);
    cg_for_end(b, &li, 0, NULL);
}

/* The packed element kp of operand q at (i, k) / (k, j) (fixed: the position along the
 * other axis) of the K chunk starting at kb: PACK_BF16 the pair k = kb + 2kp, kb + 2kp + 1
 * (the second 0 past the chunk), PACK_F32 k = kb + kp. */
static loom_status pack_pair(kc *c, const mm_plan *mp, int32_t q, MlirValue p, MlirValue fixed,
                             MlirValue kb, MlirValue kp, bool odd_tail, MlirValue *out) {
    cg_b *b = c->b;
    MlirValue k0 = cg_iadd(b, kb, cg_imul_c(b, kp, mp->mk.pk)), k1 = cg_iadd(b, k0, cg_idx(b, 1));
    MlirValue lo, hi;
    loom_status st = q == 0 ? eval_operand(c, mp, 0, p, fixed, k0, &lo)
                            : eval_operand(c, mp, 1, p, k0, fixed, &lo);
    if (st != LOOM_OK || mp->mk.pk == 1) {
        *out = lo;
        return st;
    }
    if (odd_tail)
        hi = cg_cf(b, b->f32, 0.0);
    else if ((st = q == 0 ? eval_operand(c, mp, 0, p, fixed, k1, &hi)
                          : eval_operand(c, mp, 1, p, k1, fixed, &hi)) != LOOM_OK)
        return st;
    *out = cg_bf16_pair(b, lo, hi);
    return LOOM_OK;
}

/* An operand that packing reads straight from a buffer, 16 elements at a time: the buffer
 * of node `node` (f32, bf16 or f16, the root's batch axes), read as it is or as its
 * transpose of the last two axes (`tr`), converted to f32 and, where a cast to the
 * matmul's 16-bit dtype sits between (autocast's), rounded to it (`round`). */
typedef struct direct_src {
    int32_t node;
    loom_dtype dt;   /* the buffer's */
    loom_dtype round; /* the cast's 16-bit dtype, or LOOM_DTYPE_COUNT_: none */
    bool tr;
    int64_t ld, mat; /* the buffer's last extent, and elements per batch */
} direct_src;

/* Whether the matmul's B is a transpose of its last two axes (a weight gradient's dy^T, a
 * linear layer's W^T): its K runs along the rows of what the transpose reads. */
static bool b_transposed(const kc *c) {
    return loom_ir_swaps_last2(&c->g->nodes[c->g->nodes[c->k->root].inputs[1]]);
}

/* Whether operand q of the matmul is a direct_src: a buffer, its transpose (a linear
 * layer's W^T, a weight gradient's dy^T), or either of a 16-bit cast of an f32 buffer. */
static bool direct_operand(const kc *c, const mm_plan *mp, int32_t q, direct_src *ds) {
    const loom_ir_graph *g = c->g;
    const loom_ir_node *root = &g->nodes[c->k->root];
    int32_t x = root->inputs[q], r = root->rank;
    ds->tr = false;
    ds->round = LOOM_DTYPE_COUNT_;
    if (c->s->buf_of[x] < 0 && loom_ir_swaps_last2(&g->nodes[x])) {
        ds->tr = true;
        x = g->nodes[x].inputs[0];
    }
    const loom_ir_node *n = &g->nodes[x];
    if (c->s->buf_of[x] < 0 && n->op == LOOM_IR_OP_CAST && n->dtype == mp->dt && is_16(mp->dt) &&
        g->nodes[n->inputs[0]].dtype == LOOM_DTYPE_F32) {
        ds->round = mp->dt;
        x = n->inputs[0];
        n = &g->nodes[x];
    }
    if (c->s->buf_of[x] < 0 || n->rank != r || (n->dtype != mp->dt && n->dtype != LOOM_DTYPE_F32))
        return false;
    if (n->dtype == LOOM_DTYPE_F32 && mp->dt != LOOM_DTYPE_F32 && ds->round == LOOM_DTYPE_COUNT_)
        return false;
    for (int32_t d = 0; d < r - 2; d++)
        if (n->shape[d] != root->shape[d])
            return false;
    ds->node = x;
    ds->dt = n->dtype;
    ds->ld = n->shape[r - 1];
    ds->mat = n->shape[r - 2] * n->shape[r - 1];
    return true;
}

/* 16 elements of ds's buffer from `at`, as f32, rounded as ds says where they are packed as
 * f32 (bf16 pairs are rounded by their conversion, cg_cvt_bf16x32). */
static MlirValue direct_load16(kc *c, const mm_plan *mp, const direct_src *ds, MlirValue at) {
    cg_b *b = c->b;
    MlirValue v = cg_widen16(b, ds->dt, cg_vload(b, cg_vec_t(16, cg_storage_type(b, ds->dt)),
                                                 c->bufs[c->s->buf_of[ds->node]], at));
    return ds->round != LOOM_DTYPE_COUNT_ && mp->mk.pk == 1 ? cg_round16(b, ds->round, v) : v;
}

/* 16 packed elements from ds's buffer at `at`: along the buffer's row (`along_row`: 16 f32,
 * or 16 pairs from 32) or, lanes along the row but one packed element down K each, two rows
 * apart by ds->ld for the pairs. */
static MlirValue direct_packed16(kc *c, const mm_plan *mp, const direct_src *ds, MlirValue at,
                                 bool along_row) {
    cg_b *b = c->b;
    MlirValue lo = direct_load16(c, mp, ds, at);
    if (mp->mk.pk == 1)
        return lo;
    MlirValue hi = direct_load16(c, mp, ds, cg_iadd(b, at, cg_idx(b, along_row ? 16 : ds->ld)));
    return cg_cvt_bf16x32(b, lo, hi, !along_row);
}

/* The direct operand's full blocks of 16 x 16 packed elements (pass 0: whole packed
 * elements of the K chunk [kb, kb + klen)): A's rows [i0, i0 + 16 *out_n) or B's columns
 * [j0, j0 + 16 *out_n) (the full panels), packed K [0, 16 *out_kb). A row of the packed
 * block is 16 loads along the buffer's rows when they run along the packed block's rows
 * (B = S with S [K, N], A = S [M, K]), else 16 loads along the other axis transposed in
 * registers (B = S^T, A = S^T): a cache line read per 16 elements, never one per element. */
static void pack_direct(kc *c, const mm_plan *mp, const cg_mk *mk, int32_t q, const direct_src *ds,
                        MlirValue buf, MlirValue p, MlirValue a0, MlirValue a1, MlirValue kb,
                        int64_t klen, MlirValue *out_n, int64_t *out_kb) {
    cg_b *b = c->b;
    int64_t nkb = klen / mk->pk / 16;
    MlirValue n = idiv(b, isub(b, a1, a0), 16);
    *out_n = n;
    *out_kb = nkb;
    if (nkb == 0)
        return;
    /* the loads run along K where the buffer's rows are K: A = S, B = S^T; the outer loop
     * walks the buffer's rows (16 at a time) and the inner one along them, so that the 16
     * rows stream (down K first, B = S [K, N] at N = 50257 ran at half the speed) */
    bool along_k = (q == 1) == ds->tr;
    cg_for la, lk, *lo = along_k ? &la : &lk, *li = along_k ? &lk : &la;
    MlirValue hi_o = along_k ? n : cg_idx(b, nkb), hi_i = along_k ? cg_idx(b, nkb) : n;
    cg_for_begin(b, lo, cg_idx(b, 0), hi_o, 0, NULL);
    cg_for_begin(b, li, cg_idx(b, 0), hi_i, 0, NULL);
    MlirValue kk0 = cg_imul_c(b, lk.iv, 16), a = cg_iadd(b, a0, cg_imul_c(b, la.iv, 16));
    MlirValue k = cg_iadd(b, kb, cg_imul_c(b, kk0, mk->pk)); /* K's first element */
    MlirValue base = cg_imul_c(b, p, ds->mat), v[16];
    /* packed row t of the block (A: row a + t along K; B: K's kk0 + t along a) goes to dst
     * + t dstep */
    MlirValue dst = q == 0 ? cg_iadd(b, cg_imul_c(b, cg_imul_c(b, la.iv, 16), mk->kp), kk0)
                           : cg_imul_c(b, cg_iadd(b, cg_imul_c(b, la.iv, mk->kp), kk0), MK_PANEL);
    int64_t dstep = q == 0 ? mk->kp : MK_PANEL;
    if (!ds->tr) { /* load t is packed row t: a loop (16 copies of it compiled 60% slower) */
        cg_for lt;
        cg_for_begin(b, &lt, cg_idx(b, 0), cg_idx(b, 16), 0, NULL);
        MlirValue row = along_k ? cg_iadd(b, a, lt.iv) : cg_iadd(b, k, cg_imul_c(b, lt.iv, mk->pk));
        MlirValue col = along_k ? k : a;
        cg_vstore(b,
                  direct_packed16(c, mp, ds,
                                  cg_iadd(b, base, cg_iadd(b, cg_imul_c(b, row, ds->ld), col)),
                                  along_k),
                  buf, cg_iadd(b, dst, cg_imul_c(b, lt.iv, dstep)));
        cg_for_end(b, &lt, 0, NULL);
    } else { /* 16 loads across the packed rows, transposed */
        for (int t = 0; t < 16; t++) {
            MlirValue row =
                along_k ? cg_iadd(b, a, cg_idx(b, t)) : cg_iadd(b, k, cg_idx(b, t * mk->pk));
            MlirValue col = along_k ? k : a;
            v[t] = direct_packed16(
                c, mp, ds, cg_iadd(b, base, cg_iadd(b, cg_imul_c(b, row, ds->ld), col)), along_k);
        }
        cg_vtranspose16(b, v);
        for (int t = 0; t < 16; t++)
            cg_vstore(b, v[t], buf, cg_iadd(b, dst, cg_idx(b, t * dstep)));
    }
    cg_for_end(b, li, 0, NULL);
    cg_for_end(b, lo, 0, NULL);
}

/* What pack_direct leaves, one by one: of A's rows / B's columns [a0, a1), packed elements
 * [k_mid, k_hi) of those before a_mid (the full blocks' rows) and [0, k_hi) of the rest. */
static loom_status pack_rest(kc *c, const mm_plan *mp, const cg_mk *mk, int32_t q, MlirValue buf,
                             MlirValue p, MlirValue a0, MlirValue a1, MlirValue a_mid,
                             MlirValue k_mid, MlirValue kb, MlirValue k_hi, bool odd_tail) {
    cg_b *b = c->b;
    cg_for la, lk;
    MlirValue v;
    loom_status st;
    cg_for_begin(b, &la, a0, a1, 0, NULL);
    MlirValue off = isub(b, la.iv, a0), at0;
    if (q == 0)
        at0 = cg_imul_c(b, off, mk->kp);
    else
        at0 = cg_iadd(b, cg_imul_c(b, idiv(b, off, MK_PANEL), mk->kp * MK_PANEL),
                      irem(b, off, MK_PANEL));
    MlirValue k_lo = cg_select(b, cg_cmpi(b, CG_I_ULT, la.iv, a_mid), k_mid, cg_idx(b, 0));
    cg_for_begin(b, &lk, k_lo, k_hi, 0, NULL);
    if ((st = pack_pair(c, mp, q, p, la.iv, kb, lk.iv, odd_tail, &v)) != LOOM_OK)
        return st;
    cg_store(b, v, buf, cg_iadd(b, at0, q == 0 ? lk.iv : cg_imul_c(b, lk.iv, MK_PANEL)));
    cg_for_end(b, &lk, 0, NULL);
    cg_for_end(b, &la, 0, NULL);
    return LOOM_OK;
}

/* A's rows into ap[(i - i0) * kp + kk] (q 0: rows padded to mbp with zeros), or B's columns
 * into panels of 16 (q 1): bp[(pn * kp + kk) * 16 + l] holds element kk of column
 * j0 + 16 pn + l (columns padded to nbp with zeros); an element is a pair of bf16 along K
 * (PACK_BF16: B in the VNNI layout) or one f32. Of K's chunk [kb, kb + klen), packed as mk
 * (kp = its packed length).
 * A direct_src operand is packed by pack_direct and pack_rest; any other is evaluated
 * element by element, in an order that reads along its source's rows. */
static loom_status pack_panels(kc *c, const mm_plan *mp, const cg_mk *mk, int32_t q, MlirValue buf,
                               MlirValue p, MlirValue i0, MlirValue i1, MlirValue j0, MlirValue j1,
                               MlirValue kb, int64_t klen) {
    cg_b *b = c->b;
    loom_status st;
    int64_t kfull = klen / mk->pk;
    MlirValue zero = cg_idx(b, 0), v;
    direct_src ds;
    if (direct_operand(c, mp, q, &ds)) {
        MlirValue a0 = q == 0 ? i0 : j0, a1 = q == 0 ? i1 : j1, nb;
        int64_t nkb;
        pack_direct(c, mp, mk, q, &ds, buf, p, a0, a1, kb, klen, &nb, &nkb);
        /* nothing left where every block's rows (columns) and K are whole blocks of 16 */
        int64_t ext = q == 0 ? mp->M : mp->N, per = q == 0 ? mp->rows : mp->cols;
        if (ext % per == 0 && per % 16 == 0 && klen % (16 * mk->pk) == 0)
            goto pad;
        MlirValue a_mid = cg_iadd(b, a0, cg_imul_c(b, nb, 16)), kfv = cg_idx(b, kfull);
        if ((st = pack_rest(c, mp, mk, q, buf, p, a0, a1, a_mid, cg_idx(b, 16 * nkb), kb, kfv,
                            false)) != LOOM_OK ||
            (klen % mk->pk && (st = pack_rest(c, mp, mk, q, buf, p, a0, a1, a1, kfv, kb,
                                              cg_idx(b, kfull + 1), true)) != LOOM_OK))
            return st;
        goto pad;
    }
    for (int pass = 0; pass < 1 + (klen % mk->pk); pass++) { /* full pairs, an odd tail */
        MlirValue klo = cg_idx(b, pass ? kfull : 0), khi = cg_idx(b, pass ? kfull + 1 : kfull);
        cg_for lo, lin;
        if (q == 0) {
            cg_for_begin(b, &lo, i0, i1, 0, NULL);
            MlirValue arow = cg_imul_c(b, cg_bin(b, "arith.subi", lo.iv, i0), mk->kp);
            cg_for_begin(b, &lin, klo, khi, 0, NULL);
            if ((st = pack_pair(c, mp, 0, p, lo.iv, kb, lin.iv, pass == 1, &v)) != LOOM_OK)
                return st;
            cg_store(b, v, buf, cg_iadd(b, arow, lin.iv));
            cg_for_end(b, &lin, 0, NULL);
            cg_for_end(b, &lo, 0, NULL);
        } else if (b_transposed(c)) {
            /* B = transpose(S) with S [N, K] row-major: read along S's rows (K) innermost,
             * in blocks of K so that the panels' rows being written stay in L1. Element by
             * element across columns read a cache line of each of 16 rows of S per pair. */
            enum { KBLK = 64 };
            int64_t k_lo = pass ? kfull : 0, k_hi = pass ? kfull + 1 : kfull;
            cg_for lb, lp, lk;
            cg_for_begin(b, &lb, zero, cg_idx(b, (k_hi - k_lo + KBLK - 1) / KBLK), 0, NULL);
            MlirValue kb0 = cg_iadd(b, cg_idx(b, k_lo), cg_imul_c(b, lb.iv, KBLK));
            MlirValue kb1 = cg_imin(b, cg_iadd(b, kb0, cg_idx(b, KBLK)), cg_idx(b, k_hi));
            MlirValue npn =
                cg_bin(b, "arith.divui",
                       cg_iadd(b, cg_bin(b, "arith.subi", j1, j0), cg_idx(b, MK_PANEL - 1)),
                       cg_idx(b, MK_PANEL));
            cg_for_begin(b, &lp, zero, npn, 0, NULL);
            MlirValue jp = cg_iadd(b, j0, cg_imul_c(b, lp.iv, MK_PANEL));
            cg_for_begin(b, &lin, jp, cg_imin(b, cg_iadd(b, jp, cg_idx(b, MK_PANEL)), j1), 0, NULL);
            MlirValue col = cg_bin(b, "arith.subi", lin.iv, jp);
            cg_for_begin(b, &lk, kb0, kb1, 0, NULL);
            if ((st = pack_pair(c, mp, 1, p, lin.iv, kb, lk.iv, pass == 1, &v)) != LOOM_OK)
                return st;
            MlirValue at = cg_iadd(
                b, cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lp.iv, mk->kp), lk.iv), MK_PANEL), col);
            cg_store(b, v, buf, at);
            cg_for_end(b, &lk, 0, NULL);
            cg_for_end(b, &lin, 0, NULL);
            cg_for_end(b, &lp, 0, NULL);
            cg_for_end(b, &lb, 0, NULL);
        } else {
            /* for each pair row, panel by panel: 16 contiguous columns in, 16 pairs out */
            cg_for lp;
            MlirValue npn =
                cg_bin(b, "arith.divui",
                       cg_iadd(b, cg_bin(b, "arith.subi", j1, j0), cg_idx(b, MK_PANEL - 1)),
                       cg_idx(b, MK_PANEL));
            cg_for_begin(b, &lo, klo, khi, 0, NULL);
            cg_for_begin(b, &lp, cg_idx(b, 0), npn, 0, NULL);
            MlirValue jp = cg_iadd(b, j0, cg_imul_c(b, lp.iv, MK_PANEL));
            MlirValue at0 =
                cg_bin(b, "arith.subi",
                       cg_imul_c(b, cg_iadd(b, cg_imul_c(b, lp.iv, mk->kp), lo.iv), MK_PANEL), jp);
            cg_for_begin(b, &lin, jp, cg_imin(b, cg_iadd(b, jp, cg_idx(b, MK_PANEL)), j1), 0, NULL);
            if ((st = pack_pair(c, mp, 1, p, lin.iv, kb, lo.iv, pass == 1, &v)) != LOOM_OK)
                return st;
            cg_store(b, v, buf, cg_iadd(b, at0, lin.iv));
            cg_for_end(b, &lin, 0, NULL);
            cg_for_end(b, &lp, 0, NULL);
            cg_for_end(b, &lo, 0, NULL);
        }
    }
pad:
    if (q == 0) { /* pad rows of A */
        zero_fill(b, pack_zero(b, mp), buf, cg_bin(b, "arith.subi", i1, i0), cg_idx(b, mp->mbp),
                  mk->kp, zero, cg_idx(b, mk->kp));
        return LOOM_OK;
    }
    /* pad columns of B (panel by panel, one row of 16 per pair) */
    cg_for lj, lk;
    cg_for_begin(b, &lj, cg_bin(b, "arith.subi", j1, j0), cg_idx(b, mp->mk.nbp), 0, NULL);
    MlirValue pn = cg_bin(b, "arith.divui", lj.iv, cg_idx(b, MK_PANEL));
    MlirValue l = cg_bin(b, "arith.remui", lj.iv, cg_idx(b, MK_PANEL));
    MlirValue base = cg_iadd(b, cg_imul_c(b, pn, mk->kp * MK_PANEL), l);
    cg_for_begin(b, &lk, zero, cg_idx(b, mk->kp), 0, NULL);
    cg_store(b, pack_zero(b, mp), buf, cg_iadd(b, base, cg_imul_c(b, lk.iv, MK_PANEL)));
    cg_for_end(b, &lk, 0, NULL);
    cg_for_end(b, &lj, 0, NULL);
    return LOOM_OK;
}

/* One chunk of K, [kb, kb + klen) packed as mk: the block's A rows and B columns packed,
 * then multiplied into C (set by it where first holds, else accumulated). */
static loom_status chunk_product(kc *c, const mm_plan *mp, const cg_mk *mk, MlirValue A,
                                 MlirValue B, MlirValue C, MlirValue p, MlirValue i0, MlirValue i1,
                                 MlirValue j0, MlirValue j1, MlirValue kb, int64_t klen,
                                 MlirValue first) {
    cg_b *b = c->b;
    loom_status st;
    if ((st = pack_panels(c, mp, mk, 0, A, p, i0, i1, j0, j1, kb, klen)) != LOOM_OK ||
        (st = pack_panels(c, mp, mk, 1, B, p, i0, i1, j0, j1, kb, klen)) != LOOM_OK)
        return st;
    c->ns = &mp->ns;
    cg_clear_gv(c);
    cg_mk_tiles(c, mk, A, cg_idx(b, 0), B, C, cg_bin(b, "arith.subi", i1, i0),
                cg_bin(b, "arith.subi", j1, j0), true, first, NULL);
    return LOOM_OK;
}

loom_status cg_lower_matmul(kc *c) {
    const loom_ir_graph *g = c->g;
    int32_t root_id = c->k->root;
    const loom_ir_node *root = &g->nodes[root_id];
    if (root->n_inputs != 2 || root->rank < 2)
        return cg_bad_plan(c, root_id, "a matmul without two operands of rank >= 2");
    const loom_ir_node *an = &g->nodes[root->inputs[0]];
    int32_t r = root->rank;
    mm_kind kind = mm_kind_of(root->dtype, an->shape[r - 2], an->shape[r - 1], root->shape[r - 1]);
    /* an f32 operand computed here (a transpose the plan let join: loom_ir_matmul_operand_
     * fuses) is evaluated while packing it, on any host's microkernel tiles */
    bool fused_t = false, other = false;
    for (int32_t i = 0; i < 2; i++)
        if (c->s->buf_of[root->inputs[i]] < 0) {
            bool ok = loom_ir_matmul_operand_fuses(g, root_id, root->inputs[i]);
            fused_t |= ok;
            other |= !ok;
        }
    if (kind == MM_PLAIN && root->dtype == LOOM_DTYPE_F32 && fused_t && !other)
        kind = MM_PACK_F32;
    for (int32_t i = 0; i < 2; i++)
        if (c->s->buf_of[root->inputs[i]] < 0 && kind == MM_PLAIN)
            return cg_unsupported(c, root->inputs[i],
                                  "a matmul operand computed inside the matmul's kernel (codegen "
                                  "reads matmul operands from buffers: fuse producers elsewhere)");
    if (root->dtype == LOOM_DTYPE_BOOL)
        return cg_unsupported(c, root_id, "a bool matmul");
    mm_plan *mp = loom_ir_alloc(&c->s->alloc, sizeof *mp);
    if (!mp)
        return cg_oom(c);
    memset(mp, 0, sizeof *mp);
    loom_status st = LOOM_OK;
    mp->P = loom_ir_numel(r - 2, root->shape);
    mp->M = an->shape[r - 2];
    mp->K = an->shape[r - 1];
    mp->N = root->shape[r - 1];
    mp->dt = root->dtype;
    /* about 8 blocks per batch when M allows (tasks for the pool), in multiples of 8 */
    int64_t rows = mp->M / 8 / 8 * 8;
    rows = rows < MM_ROWS_MIN ? MM_ROWS_MIN : rows > MM_ROWS_MAX ? MM_ROWS_MAX : rows;
    /* wide products get their tasks from column blocks: then rows as tall as allowed, in
     * blocks of about equal height (each row block streams and packs all of B once; the
     * schedule tiles the rows for the caches itself). conv2's W[64,288] x cols[288,36864]
     * ran 25% faster in one 64-row block than in two of 32, the gradient of its columns
     * [288,64] x [64,36864] 15% faster in one 288-row block than in three of 96. Only
     * when the columns do get split (a scratch accumulator holds rows x cols). */
    if (mp->N >= MM_WIDE_N && mp->M > 0 &&
        mp->P * ceil_div(mp->M, MM_WIDE_ROWS_MAX) < MM_TASKS_MIN) {
        rows = ceil_div(ceil_div(mp->M, ceil_div(mp->M, MM_WIDE_ROWS_MAX)), 8) * 8;
    } else if (mp->K * mp->N >= MM_B_STREAMS && mp->M > 0) {
        /* a B bigger than the caches streams from memory once per row block: fewer, taller
         * blocks. Plain kinds take 4 (tasks for 4 threads): conv2's weight gradient
         * [288,36864] x [36864,64] (B 9 MB) ran 8% faster in 4 blocks than in 9 of 32 rows.
         * Packed kinds take 2 where their tasks come from column blocks too (MK_SPLIT_BELOW).
         * On a Zen 5, 2 threads (bench_gemm --best; f32 against OpenBLAS's AVX-512 sgemm,
         * bf16 against oneDNN), 4 blocks -> 2: f32 1024^3 0.87-0.89x -> 0.93-0.98x,
         * 512 x 1024 x 1024 0.80-0.81x -> 0.96-0.98x, 256 x 2048 x 2048 0.69-0.71x ->
         * 0.88-0.93x; bf16 512 x 1024 x 1024 0.70-0.72x -> 0.84-0.85x, 256 x 2048 x 2048
         * 0.57-0.61x -> 0.76-0.79x. 2048^3 as fast, one thread as fast or faster; one block
         * of up to 512 rows measured as 2. */
        int64_t part =
            ceil_div(mp->M, mk_cols_split(kind, mp->N) ? MK_B_STREAM_BLOCKS : MM_B_STREAM_BLOCKS);
        part = ceil_div(part, 8) * 8;
        part = part > MM_WIDE_ROWS_MAX ? MM_WIDE_ROWS_MAX : part;
        rows = part > rows ? part : rows;
    }
    mp->rows = mp->M < rows ? (mp->M > 0 ? mp->M : 1) : rows;
    mp->nbm = ceil_div(mp->M, mp->rows);
    mp->cols = mm_cols(mp->P * mp->nbm, mp->N);
    if (mk_cols_split(kind, mp->N) && mp->P * mp->nbm < MK_SPLIT_BELOW) {
        /* few row blocks: tasks of column blocks too, so that each thread packs only the
         * columns of B it multiplies (64x512x512 spent as long packing B as using it); not
         * with more row blocks, as each column block packs A's rows again: with a long K
         * (all of its chunks) up to MK_LONG_K_TASKS tasks only */
        int64_t nbn = ceil_div(mp->K > MK_KCHUNK_FROM ? MK_LONG_K_TASKS : 2 * MK_SPLIT_BELOW,
                               mp->P * mp->nbm);
        nbn = nbn > mp->N / MK_COLS_MIN ? mp->N / MK_COLS_MIN : nbn;
        mp->cols = ceil_div(ceil_div(mp->N, nbn), MK_COLS_MIN) * MK_COLS_MIN;
    }
    if (kind != MM_PLAIN && mp->N >= MM_WIDE_N) {
        /* wide packed products: a task's C block (f32 scratch) small enough to stay in L2
         * until the epilogue reads it back (MK_C_BYTES) */
        int64_t cmax = MK_C_BYTES / (mp->rows * 4) / MK_COLS_MIN * MK_COLS_MIN;
        cmax = cmax < MK_COLS_MIN ? MK_COLS_MIN : cmax;
        mp->cols = mp->cols > cmax ? cmax : mp->cols;
    }
    mp->nbn = ceil_div(mp->N, mp->cols);
    mp->linalg = c->use_linalg && mm_linalg_ok(root, mp->M, mp->K, mp->N);
    mp->kind = kind;
    cg_mk_shape(&mp->mk, mp->cols);
    mp->mbp = ceil_div(mp->rows, mp->mk.mr) * mp->mk.mr;
    mp->mk.nbp = ceil_div(mp->cols, mp->mk.nv * MK_PANEL) * mp->mk.nv * MK_PANEL;
    mp->mk.pk = kind == MM_PACK_BF16 ? 2 : 1;
    /* a long K in chunks, so that a task's packed A rows and B columns stay in the caches
     * (packed whole, K = 50257 made GPT-2's lm_head gradient 128 x 50257 of A per task) */
    mp->kc = kind != MM_PLAIN && mp->K > MK_KCHUNK_FROM ? MK_KCHUNK : mp->K;
    mp->mk.kp = ceil_div(mp->kc, mp->mk.pk);
    for (int32_t q = 0; q < 2 && kind != MM_PLAIN; q++) {
        const loom_ir_node *on = &g->nodes[root->inputs[q]];
        cg_nest_init(&mp->ons[q], on->rank, on->shape);
        mp->ons[q].no_merge = true;
        sink sk = {.node = root->inputs[q], .store = false};
        cg_identity_map(&mp->ons[q], &sk.map);
        if ((st = cg_plan_nest(c, &mp->ons[q], 1, &sk)) != LOOM_OK)
            goto done;
    }

    /* the accumulator: the root's own buffer when it has the accumulator's type, else an
     * epilogue result's of the same type and shape (overwritten in place), else scratch
     * (always for the packed kinds: the microkernel's C has rows of whole tiles) */
    bool own = mp->kind == MM_PLAIN && (mp->dt == LOOM_DTYPE_F32 || mp->dt == LOOM_DTYPE_F64 ||
                                        mp->dt == LOOM_DTYPE_I32 || mp->dt == LOOM_DTYPE_I64);
    mp->acc_res = own && c->s->res_of[root_id] >= 0 ? root_id : -1;
    for (int32_t i = 0; i < c->k->n_results && own && mp->acc_res < 0; i++) {
        int32_t id = c->k->results[i];
        /* not one that may be a donated input the epilogue reads (updated in place:
         * loom_ir_plan_can_update_in_place), which the product would overwrite first */
        bool may_alias = false;
        for (int32_t a = 0; a < c->k->n_args && !may_alias; a++)
            may_alias = same_shape(&g->nodes[c->k->args[a]], &g->nodes[id]);
        if (c->s->dep_root[id] && !may_alias && same_shape(&g->nodes[id], root) &&
            g->nodes[id].dtype == mp->dt)
            mp->acc_res = id;
    }
    /* the root itself is written by the product loop when it is the accumulator */
    if ((st = cg_plan_epilogue(c, &mp->ns, mp->epi, &mp->n_epi,
                               mp->acc_res == root_id ? root_id : -1)) != LOOM_OK)
        goto done;
    int64_t numel = loom_ir_numel(root->rank, root->shape);
    c->extent = numel > 0 ? mp->P * mp->nbm * mp->nbn : 1;
    c->grain = cg_grain_for(mp->rows * mp->cols * (mp->K > 0 ? mp->K : 1));
    if (!c->emit || numel == 0)
        goto done;

    cg_b *b = c->b;
    c->ns = &mp->ns;
    cg_clear_gv(c);
    mp->acc_t = is_16(mp->dt) ? b->f32 : cg_compute_type(b, mp->dt);
    MlirValue A = {NULL}, B = {NULL};
    if (mp->kind == MM_PLAIN) {
        A = c->bufs[c->s->buf_of[root->inputs[0]]];
        B = c->bufs[c->s->buf_of[root->inputs[1]]];
    }
    MlirValue C;
    bool scratch = mp->acc_res < 0, bf = mp->kind != MM_PLAIN;
    mp->cstride = bf ? mp->mk.nbp : scratch ? mp->cols : mp->N;
    /* packed A and B, and which (batch, column block) B holds and which (batch, row block)
     * A holds (-1: none yet) */
    MlirValue packs[3] = {{NULL}, {NULL}, {NULL}};
    if (bf) {
        MlirType et = mp->mk.pk == 2 ? b->i32 : b->f32;
        packs[0] = cg_alloc_buf(b, et, mp->mbp * mp->mk.kp);
        packs[1] = cg_alloc_buf(b, et, mp->mk.kp * mp->mk.nbp);
    }
    if (mp->kind != MM_PLAIN && mp->kc == mp->K) {
        packs[2] = cg_alloc_buf(b, b->i64, 2);
        cg_store(b, cg_ci(b, b->i64, -1), packs[2], cg_idx(b, 0));
        cg_store(b, cg_ci(b, b->i64, -1), packs[2], cg_idx(b, 1));
    }
    if (scratch) { /* one malloc'd block of rows x cols per call, freed at the end */
        C = cg_alloc_buf(b, mp->acc_t, bf ? mp->mbp * mp->mk.nbp : mp->rows * mp->cols);
    } else {
        C = c->bufs[c->s->res_of[mp->acc_res]];
    }
    cg_for lo;
    cg_for_begin(b, &lo, c->lo, c->hi, 0, NULL);
    /* task = (p * nbm + ib) * nbn + jb: a row block's column blocks are adjacent tasks;
     * packed kinds: (p * nbn + jb) * nbm + ib, a column block's row blocks (one packed B) */
    MlirValue nbnv = cg_idx(b, mp->nbn), nbmv = cg_idx(b, mp->nbm), p, ib, jb;
    if (mp->kind == MM_PLAIN) {
        MlirValue pib = mp->nbn > 1 ? cg_bin(b, "arith.divui", lo.iv, nbnv) : lo.iv;
        jb = mp->nbn > 1 ? cg_bin(b, "arith.remui", lo.iv, nbnv) : cg_idx(b, 0);
        p = mp->nbm > 1 ? cg_bin(b, "arith.divui", pib, nbmv) : pib;
        ib = mp->nbm > 1 ? cg_bin(b, "arith.remui", pib, nbmv) : cg_idx(b, 0);
    } else {
        MlirValue pjb = mp->nbm > 1 ? cg_bin(b, "arith.divui", lo.iv, nbmv) : lo.iv;
        ib = mp->nbm > 1 ? cg_bin(b, "arith.remui", lo.iv, nbmv) : cg_idx(b, 0);
        p = mp->nbn > 1 ? cg_bin(b, "arith.divui", pjb, nbnv) : pjb;
        jb = mp->nbn > 1 ? cg_bin(b, "arith.remui", pjb, nbnv) : cg_idx(b, 0);
    }
    MlirValue i0 = cg_imul_c(b, ib, mp->rows);
    MlirValue i1 = cg_imin(b, cg_iadd(b, i0, cg_idx(b, mp->rows)), cg_idx(b, mp->M));
    MlirValue j0 = cg_imul_c(b, jb, mp->cols);
    MlirValue j1 = cg_imin(b, cg_iadd(b, j0, cg_idx(b, mp->cols)), cg_idx(b, mp->N));
    /* C[i, j] is at crow(i) + j - jc: the block's columns start at 0 in scratch */
    MlirValue cbase = scratch ? cg_idx(b, 0) : cg_imul_c(b, cg_imul_c(b, p, mp->M), mp->N);
    MlirValue jc = j0;
    if (mp->kind != MM_PLAIN && mp->kc < mp->K) {
        A = packs[0];
        B = packs[1];
        /* K in chunks: full ones in a loop, the rest after it, each chunk's A rows and B
         * columns packed and multiplied into C (the first chunk sets it) */
        int64_t nfull = mp->K / mp->kc, tail = mp->K % mp->kc;
        cg_for lk;
        cg_for_begin(b, &lk, cg_idx(b, 0), cg_idx(b, nfull), 0, NULL);
        st = chunk_product(c, mp, &mp->mk, A, B, C, p, i0, i1, j0, j1, cg_imul_c(b, lk.iv, mp->kc),
                           mp->kc, cg_cmpi(b, CG_I_EQ, lk.iv, cg_idx(b, 0)));
        cg_for_end(b, &lk, 0, NULL);
        if (st == LOOM_OK && tail > 0) {
            cg_mk mt = mp->mk;
            mt.kp = ceil_div(tail, mt.pk);
            st = chunk_product(c, mp, &mt, A, B, C, p, i0, i1, j0, j1, cg_idx(b, nfull * mp->kc),
                               tail, (MlirValue){NULL});
        }
        if (st != LOOM_OK)
            goto done;
    } else if (mp->kind != MM_PLAIN) {
        A = packs[0];
        B = packs[1];
        /* A's rows once per (batch, row block) of the call's consecutive tasks: all of them
         * where the rows are one block (GPT-2's lm_head x @ wte^T: 197 column blocks) */
        MlirValue akey =
            cg_conv(b, "arith.index_cast", cg_iadd(b, cg_imul_c(b, p, mp->nbm), ib), b->i64);
        cg_if f;
        cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, packs[2], cg_idx(b, 1)), akey));
        st = pack_panels(c, mp, &mp->mk, 0, A, p, i0, i1, j0, j1, cg_idx(b, 0), mp->K);
        if (st != LOOM_OK)
            goto done;
        cg_store(b, akey, packs[2], cg_idx(b, 1));
        cg_if_end(b, &f);
        /* B's columns once per (batch, column block) of the call's consecutive tasks */
        MlirValue key =
            cg_conv(b, "arith.index_cast", cg_iadd(b, cg_imul_c(b, p, mp->nbn), jb), b->i64);
        cg_if_begin(b, &f, cg_cmpi(b, CG_I_NE, cg_load(b, packs[2], cg_idx(b, 0)), key));
        st = pack_panels(c, mp, &mp->mk, 1, B, p, i0, i1, j0, j1, cg_idx(b, 0), mp->K);
        if (st != LOOM_OK)
            goto done;
        cg_store(b, key, packs[2], cg_idx(b, 0));
        cg_if_end(b, &f);
        c->ns = &mp->ns;
        cg_clear_gv(c);
        cg_mk_tiles(c, &mp->mk, A, cg_idx(b, 0), B, C, cg_bin(b, "arith.subi", i1, i0),
                    cg_bin(b, "arith.subi", j1, j0), false, (MlirValue){NULL}, NULL);
    } else if (mp->linalg) {
        MlirValue crow0 =
            scratch ? cbase : cg_iadd(b, cg_iadd(b, cbase, cg_imul_c(b, i0, mp->N)), j0);
        int64_t nfull = mp->N / mp->cols, nrem = mp->N % mp->cols;
        if (nrem) {
            cg_if f;
            cg_if_begin(b, &f, cg_cmpi(b, CG_I_ULT, jb, cg_idx(b, nfull)));
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, mp->cols);
            cg_if_end(b, &f);
            cg_if_begin(b, &f, cg_cmpi(b, CG_I_EQ, jb, cg_idx(b, nfull)));
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, nrem);
            cg_if_end(b, &f);
        } else {
            emit_mm_rows_linalg(c, mp, A, B, C, p, ib, i0, j0, crow0, mp->cols);
        }
    } else {
        /* for i: C[i,:] = 0; for k: C[i,:] += A[i,k] * B[k,:] */
        cg_b *bb = b;
        cg_for li, lk, lj;
        cg_for_begin(bb, &li, i0, i1, 0, NULL);
        MlirValue crow =
            scratch ? cg_bin(bb, "arith.subi",
                             cg_imul_c(bb, cg_bin(bb, "arith.subi", li.iv, i0), mp->cstride), jc)
                    : cg_iadd(bb, cbase, cg_imul_c(bb, li.iv, mp->N));
        cg_for_begin(bb, &lj, j0, j1, 0, NULL);
        MlirValue zero =
            loom_ir_dtype_is_float(mp->dt) ? cg_cf(bb, mp->acc_t, 0.0) : cg_ci(bb, mp->acc_t, 0);
        cg_store(bb, zero, C, cg_iadd(bb, crow, lj.iv));
        cg_for_end(bb, &lj, 0, NULL);
        MlirValue arow = cg_imul_c(bb, cg_iadd(bb, cg_imul_c(bb, p, mp->M), li.iv), mp->K);
        MlirValue bbase = cg_imul_c(bb, p, mp->K * mp->N);
        cg_for_begin(bb, &lk, cg_idx(bb, 0), cg_idx(bb, mp->K), 0, NULL);
        MlirValue av = cg_load_val(bb, an->dtype, A, cg_iadd(bb, arow, lk.iv));
        MlirValue brow = cg_iadd(bb, bbase, cg_imul_c(bb, lk.iv, mp->N));
        cg_for_begin(bb, &lj, j0, j1, 0, NULL);
        MlirValue bv =
            cg_load_val(bb, g->nodes[root->inputs[1]].dtype, B, cg_iadd(bb, brow, lj.iv));
        MlirValue ci = cg_iadd(bb, crow, lj.iv);
        bool fl = loom_ir_dtype_is_float(mp->dt);
        MlirValue prod = cg_bin(bb, fl ? "arith.mulf" : "arith.muli", av, bv);
        cg_store(bb, cg_bin(bb, fl ? "arith.addf" : "arith.addi", cg_load(bb, C, ci), prod), C, ci);
        cg_for_end(bb, &lj, 0, NULL);
        cg_for_end(bb, &lk, 0, NULL);
        cg_for_end(bb, &li, 0, NULL);
    }
    if (mp->n_epi > 0) {
        /* epilogue over the block's rows: batch indices from p, then i, j */
        int32_t bgroups[R], nbg = 0;
        for (int32_t d = 0; d < r - 2; d++)
            if (mp->ns.dim_group[d] >= 0)
                bgroups[nbg++] = mp->ns.dim_group[d];
        if (nbg > 0)
            cg_delinearize(c, p, nbg, bgroups);
        cg_for li, lj;
        cg_for_begin(b, &li, i0, i1, 0, NULL);
        if (mp->ns.dim_group[r - 2] >= 0)
            c->gv[mp->ns.dim_group[r - 2]] = li.iv;
        MlirValue crow =
            scratch ? cg_bin(b, "arith.subi",
                             cg_imul_c(b, cg_bin(b, "arith.subi", li.iv, i0), mp->cstride), jc)
                    : cg_iadd(b, cbase, cg_imul_c(b, li.iv, mp->N));
        cg_for_begin(b, &lj, j0, j1, 0, NULL);
        if (mp->ns.dim_group[r - 1] >= 0)
            c->gv[mp->ns.dim_group[r - 1]] = lj.iv;
        MlirValue acc = cg_load(b, C, cg_iadd(b, crow, lj.iv));
        c->bound_v = is_16(mp->dt) ? cg_round16(b, mp->dt, acc) : acc;
        st = cg_emit_sinks(c, mp->n_epi, mp->epi);
        cg_for_end(b, &lj, 0, NULL);
        cg_for_end(b, &li, 0, NULL);
    }
    cg_for_end(b, &lo, 0, NULL);
    if (scratch)
        cg_op(b, "memref.dealloc", 1, &C, 0, NULL, 0, NULL);
    for (int32_t q = 0; q < 3; q++)
        if (!mlirValueIsNull(packs[q]))
            cg_op(b, "memref.dealloc", 1, &packs[q], 0, NULL, 0, NULL);
done:
    loom_ir_free(&c->s->alloc, mp, sizeof *mp);
    return st;
}

bool loom_cg_kernel_uses_linalg(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k) {
    const loom_ir_kernel *kr = &plan->kernels[k];
    if (kr->kind != LOOM_IR_KERNEL_ROOTED || kr->root < 0 || kr->root >= g->n_nodes)
        return false;
    const loom_ir_node *root = &g->nodes[kr->root];
    if (root->op != LOOM_IR_OP_MATMUL || root->rank < 2 || root->n_inputs != 2)
        return false;
    const loom_ir_node *an = &g->nodes[root->inputs[0]];
    return mm_linalg_ok(root, an->shape[root->rank - 2], an->shape[root->rank - 1],
                        root->shape[root->rank - 1]) &&
           loom_ir_numel(root->rank, root->shape) > 0;
}
