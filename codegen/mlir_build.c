/* MLIR op builders for codegen: ops created through the C API's operation states (no IR
 * text), appended at the builder's insertion block; structured loops and ifs. */
#include <stdio.h>
#include <string.h>

#include "cg_internal.h"

static MlirStringRef str(const char *s) {
    return mlirStringRefCreateFromCString(s);
}

void cg_b_init(cg_b *b, MlirContext ctx, MlirModule module) {
    memset(b, 0, sizeof *b);
    b->ctx = ctx;
    b->module = module;
    b->loc = mlirLocationUnknownGet(ctx);
    b->block = mlirModuleGetBody(module);
    b->index = mlirIndexTypeGet(ctx);
    b->i1 = mlirIntegerTypeGet(ctx, 1);
    b->i8 = mlirIntegerTypeGet(ctx, 8);
    b->i16 = mlirIntegerTypeGet(ctx, 16);
    b->i32 = mlirIntegerTypeGet(ctx, 32);
    b->i64 = mlirIntegerTypeGet(ctx, 64);
    b->f16 = mlirF16TypeGet(ctx);
    b->f32 = mlirF32TypeGet(ctx);
    b->f64 = mlirF64TypeGet(ctx);
    b->fma = loom_cg_host_has_fma();
}

void cg_print_to_sbuf(MlirStringRef s, void *ud) {
    loom_ir_sbuf_append(ud, s.data, s.length);
}

MlirNamedAttribute cg_named(cg_b *b, const char *name, MlirAttribute attr) {
    return mlirNamedAttributeGet(mlirIdentifierGet(b->ctx, str(name)), attr);
}

MlirOperation cg_op(cg_b *b, const char *name, intptr_t n_operands, const MlirValue *operands,
                    intptr_t n_results, const MlirType *results, intptr_t n_attrs,
                    const MlirNamedAttribute *attrs) {
    MlirOperationState st = mlirOperationStateGet(str(name), b->loc);
    if (n_operands)
        mlirOperationStateAddOperands(&st, n_operands, operands);
    if (n_results)
        mlirOperationStateAddResults(&st, n_results, results);
    if (n_attrs)
        mlirOperationStateAddAttributes(&st, n_attrs, attrs);
    MlirOperation op = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(b->block, op);
    return op;
}

MlirValue cg_v(cg_b *b, const char *name, intptr_t n, const MlirValue *operands, MlirType result) {
    return mlirOperationGetResult(cg_op(b, name, n, operands, 1, &result, 0, NULL), 0);
}

static MlirValue constant(cg_b *b, MlirType t, MlirAttribute value) {
    MlirNamedAttribute a = cg_named(b, "value", value);
    return mlirOperationGetResult(cg_op(b, "arith.constant", 0, NULL, 1, &t, 1, &a), 0);
}

MlirValue cg_cf(cg_b *b, MlirType t, double v) {
    return constant(b, t, mlirFloatAttrDoubleGet(b->ctx, t, v));
}

MlirValue cg_ci(cg_b *b, MlirType t, int64_t v) {
    return constant(b, t, mlirIntegerAttrGet(t, v));
}

MlirValue cg_idx(cg_b *b, int64_t v) {
    return cg_ci(b, b->index, v);
}

MlirValue cg_bin(cg_b *b, const char *name, MlirValue x, MlirValue y) {
    MlirValue ops[2] = {x, y};
    return cg_v(b, name, 2, ops, mlirValueGetType(x));
}

MlirValue cg_un(cg_b *b, const char *name, MlirValue x) {
    return cg_v(b, name, 1, &x, mlirValueGetType(x));
}

MlirValue cg_conv(cg_b *b, const char *name, MlirValue x, MlirType to) {
    return cg_v(b, name, 1, &x, to);
}

MlirValue cg_fma(cg_b *b, MlirValue x, MlirValue y, MlirValue z) {
    MlirValue ops[3] = {x, y, z};
    return cg_v(b, "math.fma", 3, ops, mlirValueGetType(x));
}

MlirValue cg_muladd(cg_b *b, MlirValue x, MlirValue y, MlirValue z) {
    if (b->fma)
        return cg_fma(b, x, y, z);
    return cg_bin(b, "arith.addf", cg_bin(b, "arith.mulf", x, y), z);
}

MlirValue cg_select(cg_b *b, MlirValue c, MlirValue t, MlirValue f) {
    MlirValue ops[3] = {c, t, f};
    return cg_v(b, "arith.select", 3, ops, mlirValueGetType(t));
}

static MlirValue cmp(cg_b *b, const char *name, int64_t pred, MlirValue x, MlirValue y) {
    MlirValue ops[2] = {x, y};
    MlirNamedAttribute a = cg_named(b, "predicate", mlirIntegerAttrGet(b->i64, pred));
    return mlirOperationGetResult(cg_op(b, name, 2, ops, 1, &b->i1, 1, &a), 0);
}

MlirValue cg_cmpf(cg_b *b, cg_fpred p, MlirValue x, MlirValue y) {
    return cmp(b, "arith.cmpf", p, x, y);
}

MlirValue cg_cmpi(cg_b *b, cg_ipred p, MlirValue x, MlirValue y) {
    return cmp(b, "arith.cmpi", p, x, y);
}

/* The value of an integer arith.constant, for folding index arithmetic. */
static bool const_int(MlirValue v, int64_t *out) {
    if (!mlirValueIsAOpResult(v))
        return false;
    MlirOperation op = mlirOpResultGetOwner(v);
    MlirIdentifier name = mlirOperationGetName(op);
    MlirStringRef s = mlirIdentifierStr(name);
    if (s.length != 14 || memcmp(s.data, "arith.constant", 14) != 0)
        return false;
    MlirAttribute a = mlirOperationGetAttributeByName(op, str("value"));
    if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a))
        return false;
    *out = mlirIntegerAttrGetValueInt(a);
    return true;
}

MlirValue cg_iadd(cg_b *b, MlirValue x, MlirValue y) {
    int64_t cx, cy;
    bool kx = const_int(x, &cx), ky = const_int(y, &cy);
    if (kx && ky)
        return cg_idx(b, cx + cy);
    if (kx && cx == 0)
        return y;
    if (ky && cy == 0)
        return x;
    return cg_bin(b, "arith.addi", x, y);
}

MlirValue cg_imul_c(cg_b *b, MlirValue x, int64_t c) {
    int64_t cx;
    if (c == 0)
        return cg_idx(b, 0);
    if (const_int(x, &cx))
        return cg_idx(b, cx * c);
    if (c == 1)
        return x;
    return cg_bin(b, "arith.muli", x, cg_idx(b, c));
}

MlirValue cg_imin(cg_b *b, MlirValue x, MlirValue y) {
    return cg_bin(b, "arith.minsi", x, y);
}

MlirValue cg_load(cg_b *b, MlirValue mem, MlirValue i) {
    MlirValue ops[2] = {mem, i};
    return cg_v(b, "memref.load", 2, ops, mlirShapedTypeGetElementType(mlirValueGetType(mem)));
}

void cg_store(cg_b *b, MlirValue v, MlirValue mem, MlirValue i) {
    MlirValue ops[3] = {v, mem, i};
    cg_op(b, "memref.store", 3, ops, 0, NULL, 0, NULL);
}

MlirValue cg_alloc_buf(cg_b *b, MlirType t, int64_t n) {
    MlirType mt = mlirMemRefTypeContiguousGet(t, 1, &n, mlirAttributeGetNull());
    MlirNamedAttribute seg =
        cg_named(b, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){0, 0}));
    return mlirOperationGetResult(cg_op(b, "memref.alloc", 0, NULL, 1, &mt, 1, &seg), 0);
}

void cg_for_begin(cg_b *b, cg_for *l, MlirValue lb, MlirValue ub, int n_iter,
                  const MlirValue *init) {
    MlirType types[1 + CG_MAX_ITER];
    MlirLocation locs[1 + CG_MAX_ITER];
    MlirValue ops[3 + CG_MAX_ITER] = {lb, ub, cg_idx(b, 1)};
    types[0] = b->index;
    locs[0] = b->loc;
    for (int i = 0; i < n_iter; i++) {
        types[1 + i] = mlirValueGetType(init[i]);
        locs[1 + i] = b->loc;
        ops[3 + i] = init[i];
    }
    MlirRegion region = mlirRegionCreate();
    MlirBlock body = mlirBlockCreate(1 + n_iter, types, locs);
    mlirRegionAppendOwnedBlock(region, body);
    MlirOperationState st = mlirOperationStateGet(str("scf.for"), b->loc);
    mlirOperationStateAddOperands(&st, 3 + n_iter, ops);
    if (n_iter)
        mlirOperationStateAddResults(&st, n_iter, types + 1);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    l->op = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(b->block, l->op);
    l->parent = b->block;
    l->iv = mlirBlockGetArgument(body, 0);
    for (int i = 0; i < n_iter; i++)
        l->iter[i] = mlirBlockGetArgument(body, 1 + i);
    b->block = body;
}

void cg_for_end(cg_b *b, cg_for *l, int n_yield, const MlirValue *yield) {
    cg_op(b, "scf.yield", n_yield, yield, 0, NULL, 0, NULL);
    b->block = l->parent;
}

MlirValue cg_for_result(const cg_for *l, int i) {
    return mlirOperationGetResult(l->op, i);
}

/* scf.if on cond with n results of types[], an else block when with_else (else its region
 * stays empty), appended at b's insertion point; b enters the then-block. */
static void if_begin(cg_b *b, cg_if *f, MlirValue cond, int n, const MlirType *types,
                     bool with_else) {
    MlirRegion regions[2] = {mlirRegionCreate(), mlirRegionCreate()};
    MlirBlock then_block = mlirBlockCreate(0, NULL, NULL);
    mlirRegionAppendOwnedBlock(regions[0], then_block);
    if (with_else)
        mlirRegionAppendOwnedBlock(regions[1], mlirBlockCreate(0, NULL, NULL));
    MlirOperationState st = mlirOperationStateGet(str("scf.if"), b->loc);
    mlirOperationStateAddOperands(&st, 1, &cond);
    if (n > 0)
        mlirOperationStateAddResults(&st, n, types);
    mlirOperationStateAddOwnedRegions(&st, 2, regions);
    f->op = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(b->block, f->op);
    f->parent = b->block;
    b->block = then_block;
}

void cg_if_begin(cg_b *b, cg_if *f, MlirValue cond) {
    if_begin(b, f, cond, 0, NULL, false);
}

void cg_if_end(cg_b *b, cg_if *f) {
    cg_op(b, "scf.yield", 0, NULL, 0, NULL, 0, NULL);
    b->block = f->parent;
}

void cg_ifv_begin(cg_b *b, cg_if *f, MlirValue cond, int n, const MlirType *types) {
    if_begin(b, f, cond, n, types, true);
}

void cg_ifv_else(cg_b *b, cg_if *f, int n, const MlirValue *yield) {
    cg_op(b, "scf.yield", n, yield, 0, NULL, 0, NULL);
    b->block = mlirRegionGetFirstBlock(mlirOperationGetRegion(f->op, 1));
}

void cg_ifv_end(cg_b *b, cg_if *f, int n, const MlirValue *yield) {
    cg_op(b, "scf.yield", n, yield, 0, NULL, 0, NULL);
    b->block = f->parent;
}

MlirValue cg_if_result(const cg_if *f, int i) {
    return mlirOperationGetResult(f->op, i);
}

/* func.func private @name(fty) at the top of b's module. */
static void declare_func(cg_b *b, const char *name, MlirType fty) {
    MlirNamedAttribute attrs[3] = {
        cg_named(b, "sym_name", mlirStringAttrGet(b->ctx, str(name))),
        cg_named(b, "function_type", mlirTypeAttrGet(fty)),
        cg_named(b, "sym_visibility", mlirStringAttrGet(b->ctx, str("private"))),
    };
    MlirRegion body = mlirRegionCreate();
    MlirOperationState st = mlirOperationStateGet(str("func.func"), b->loc);
    mlirOperationStateAddAttributes(&st, 3, attrs);
    mlirOperationStateAddOwnedRegions(&st, 1, &body);
    MlirBlock mod = mlirModuleGetBody(b->module);
    mlirBlockInsertOwnedOperation(mod, 0, mlirOperationCreate(&st));
}

static MlirValue call(cg_b *b, const char *name, intptr_t n, const MlirValue *args, MlirType t) {
    MlirNamedAttribute callee = cg_named(b, "callee", mlirFlatSymbolRefAttrGet(b->ctx, str(name)));
    return mlirOperationGetResult(cg_op(b, "func.call", n, args, 1, &t, 1, &callee), 0);
}

MlirValue cg_call_libm(cg_b *b, cg_libm fn, MlirValue x) {
    static const char *const names[CG_LIBM_COUNT_] = {"tanh", "erf"};
    if (!(b->libm_declared & (1u << fn))) {
        /* func.func private @tanh(f64) -> f64, resolved against the process's libm */
        declare_func(b, names[fn], mlirFunctionTypeGet(b->ctx, 1, &b->f64, 1, &b->f64));
        b->libm_declared |= 1u << fn;
    }
    return call(b, names[fn], 1, &x, b->f64);
}

MlirType cg_vec_t(int64_t n, MlirType elem) {
    return mlirVectorTypeGet(1, &n, elem);
}

MlirValue cg_vload(cg_b *b, MlirType vt, MlirValue mem, MlirValue i) {
    MlirValue ops[2] = {mem, i};
    return mlirOperationGetResult(cg_op(b, "vector.load", 2, ops, 1, &vt, 0, NULL), 0);
}

void cg_vstore(cg_b *b, MlirValue v, MlirValue mem, MlirValue i) {
    MlirValue ops[3] = {v, mem, i};
    cg_op(b, "vector.store", 3, ops, 0, NULL, 0, NULL);
}

MlirValue cg_vbroadcast(cg_b *b, MlirValue x, MlirType vt) {
    return cg_v(b, "vector.broadcast", 1, &x, vt);
}

MlirValue cg_vbitcast(cg_b *b, MlirValue v, MlirType vt) {
    return cg_v(b, "vector.bitcast", 1, &v, vt);
}

MlirValue cg_vconst_i32(cg_b *b, int64_t n, const int32_t *lanes) {
    MlirType vt = cg_vec_t(n, b->i32);
    return constant(b, vt, mlirDenseElementsAttrInt32Get(vt, n, lanes));
}

MlirValue cg_vcmpi(cg_b *b, cg_ipred p, MlirValue x, MlirValue y) {
    MlirValue ops[2] = {x, y};
    MlirType vt = cg_vec_t(mlirShapedTypeGetDimSize(mlirValueGetType(x), 0), b->i1);
    MlirNamedAttribute a = cg_named(b, "predicate", mlirIntegerAttrGet(b->i64, p));
    return mlirOperationGetResult(cg_op(b, "arith.cmpi", 2, ops, 1, &vt, 1, &a), 0);
}

void cg_prefetch(cg_b *b, MlirValue mem, MlirValue i, bool write, bool near) {
    MlirValue ops[2] = {mem, i};
    MlirNamedAttribute a[3] = {
        cg_named(b, "isWrite", mlirBoolAttrGet(b->ctx, write)),
        cg_named(b, "localityHint", mlirIntegerAttrGet(b->i32, near ? 3 : 2)),
        cg_named(b, "isDataCache", mlirBoolAttrGet(b->ctx, 1)),
    };
    cg_op(b, "memref.prefetch", 2, ops, 0, NULL, 3, a);
}

MlirValue cg_vcmpf(cg_b *b, cg_fpred p, MlirValue x, MlirValue y) {
    MlirValue ops[2] = {x, y};
    MlirType vt = cg_vec_t(mlirShapedTypeGetDimSize(mlirValueGetType(x), 0), b->i1);
    MlirNamedAttribute a = cg_named(b, "predicate", mlirIntegerAttrGet(b->i64, p));
    return mlirOperationGetResult(cg_op(b, "arith.cmpf", 2, ops, 1, &vt, 1, &a), 0);
}

MlirValue cg_vmaskload_or(cg_b *b, MlirType vt, MlirValue mem, MlirValue i, MlirValue mask,
                          MlirValue pass) {
    MlirValue ops[4] = {mem, i, mask, cg_vbroadcast(b, pass, vt)};
    return cg_v(b, "vector.maskedload", 4, ops, vt);
}

MlirValue cg_vmaskload(cg_b *b, MlirType vt, MlirValue mem, MlirValue i, MlirValue mask) {
    MlirType et = mlirShapedTypeGetElementType(vt);
    return cg_vmaskload_or(b, vt, mem, i, mask,
                           mlirTypeIsAFloat(et) ? cg_cf(b, et, 0.0) : cg_ci(b, et, 0));
}

MlirValue cg_vgather(cg_b *b, MlirType vt, MlirValue mem, MlirValue idx, MlirValue mask) {
    MlirType et = mlirShapedTypeGetElementType(vt);
    MlirValue pass =
        cg_vbroadcast(b, mlirTypeIsAFloat(et) ? cg_cf(b, et, 0.0) : cg_ci(b, et, 0), vt);
    MlirValue ops[5] = {mem, cg_idx(b, 0), idx, mask, pass};
    return cg_v(b, "vector.gather", 5, ops, vt);
}

void cg_vmaskstore(cg_b *b, MlirValue v, MlirValue mem, MlirValue i, MlirValue mask) {
    MlirValue ops[4] = {mem, i, mask, v};
    cg_op(b, "vector.maskedstore", 4, ops, 0, NULL, 0, NULL);
}

/* Not a scalar loop: LLVM vectorizes one into a main loop, an epilogue loop and a scalar
 * rest, and the conv kernels' zero fills were 455 of the 700 loops it vectorized in
 * ResNet-50's bf16 step, a third of the step's LLVM IR. */
void cg_zero_range(cg_b *b, MlirValue mem, MlirValue at, MlirValue n, MlirValue zero) {
    int64_t cn;
    bool fixed = const_int(n, &cn);
    if (fixed && cn <= 0)
        return;
    MlirValue zv = cg_vbroadcast(b, zero, cg_vec_t(16, mlirValueGetType(zero)));
    MlirValue nn = fixed ? n : cg_bin(b, "arith.maxsi", n, cg_idx(b, 0));
    MlirValue full = fixed ? cg_idx(b, cn / 16) : cg_bin(b, "arith.divui", nn, cg_idx(b, 16));
    if (!fixed || cn >= 16) {
        cg_for l;
        cg_for_begin(b, &l, cg_idx(b, 0), full, 0, NULL);
        cg_vstore(b, zv, mem, cg_iadd(b, at, cg_imul_c(b, l.iv, 16)));
        cg_for_end(b, &l, 0, NULL);
    }
    if (fixed && cn % 16 == 0)
        return;
    MlirValue done = cg_imul_c(b, full, 16);
    MlirValue rest = fixed ? cg_idx(b, cn % 16) : cg_bin(b, "arith.subi", nn, done);
    MlirValue mask = cg_v(b, "vector.create_mask", 1, &rest, cg_vec_t(16, b->i1));
    cg_vmaskstore(b, zv, mem, cg_iadd(b, at, done), mask);
}

MlirValue cg_vshuffle(cg_b *b, MlirValue x, MlirValue y, int64_t n, const int64_t *lanes) {
    MlirAttribute at[64]; /* MLIR 19: an ArrayAttr of i64 */
    for (int64_t l = 0; l < n && l < 64; l++)
        at[l] = mlirIntegerAttrGet(b->i64, lanes[l]);
    MlirNamedAttribute a = cg_named(b, "mask", mlirArrayAttrGet(b->ctx, n < 64 ? n : 64, at));
    MlirType t = cg_vec_t(n, mlirShapedTypeGetElementType(mlirValueGetType(x)));
    MlirValue ops[2] = {x, y};
    return mlirOperationGetResult(cg_op(b, "vector.shuffle", 2, ops, 1, &t, 1, &a), 0);
}

MlirValue cg_vfence(cg_b *b, MlirValue v) {
    MlirType vt = mlirValueGetType(v), et = mlirShapedTypeGetElementType(vt);
    int64_t bits = mlirShapedTypeGetDimSize(vt, 0) *
                   (mlirTypeIsAFloat(et) ? mlirFloatTypeGetWidth(et) : mlirIntegerTypeGetWidth(et));
    int64_t n = bits / 32; /* as f32 lanes: 8, 16 or 32 (the staging's i16, f32/i32, f64) */
    if (bits % 32 != 0 || (n != 8 && n != 16 && n != 32))
        return v; /* a fence changes no value: none is as right */
    int bit = n == 8 ? 0 : n == 16 ? 1 : 2;
    char name[64];
    snprintf(name, sizeof name, "llvm.arithmetic.fence.v%df32", (int)n);
    MlirType vf = cg_vec_t(n, b->f32);
    if (!(b->fence_declared & (1u << bit))) {
        declare_func(b, name, mlirFunctionTypeGet(b->ctx, 1, &vf, 1, &vf));
        b->fence_declared |= 1u << bit;
    }
    bool same = mlirTypeEqual(vt, vf);
    MlirValue x = same ? v : cg_vbitcast(b, v, vf);
    x = call(b, name, 1, &x, vf);
    return same ? x : cg_vbitcast(b, x, vt);
}

/* Transposes the 16 x 16 matrix of rows r[0..15] in place: for block sizes 8, 4, 2, 1,
 * rows i and i + s (bit s of i clear) swap their off-diagonal s x s blocks (64 shuffles),
 * levels 2 and 3 each fenced off from the level before (cg_vfence): as good machine code,
 * with a third of the time in LLVM's shuffle combining (cg_vfence's comment). */
void cg_vtranspose16(cg_b *b, MlirValue *r) {
    for (int s = 8; s >= 1; s /= 2) {
        if (s == 4 || s == 2)
            for (int i = 0; i < 16; i++)
                r[i] = cg_vfence(b, r[i]);
        int64_t mi[16], mj[16];
        for (int l = 0; l < 16; l++) {
            mi[l] = (l & s) ? 16 + l - s : l;
            mj[l] = (l & s) ? 16 + l : l + s;
        }
        for (int i = 0; i < 16; i++)
            if (!(i & s)) {
                MlirValue x = r[i], y = r[i + s];
                r[i] = cg_vshuffle(b, x, y, 16, mi);
                r[i + s] = cg_vshuffle(b, x, y, 16, mj);
            }
    }
}

MlirValue cg_vreduce(cg_b *b, const char *kind, MlirValue v) {
    char k[64];
    snprintf(k, sizeof k, "#vector.kind<%s>", kind);
    MlirNamedAttribute a[2] = {
        cg_named(b, "kind", mlirAttributeParseGet(b->ctx, mlirStringRefCreateFromCString(k))),
        cg_named(b, "fastmath",
                 mlirAttributeParseGet(b->ctx,
                                       mlirStringRefCreateFromCString("#arith.fastmath<reassoc>"))),
    };
    MlirType t = mlirShapedTypeGetElementType(mlirValueGetType(v));
    return mlirOperationGetResult(cg_op(b, "vector.reduction", 1, &v, 1, &t, 2, a), 0);
}

MlirValue cg_vextract(cg_b *b, MlirValue v, int64_t lane) {
    MlirNamedAttribute a =
        cg_named(b, "static_position", mlirDenseI64ArrayGet(b->ctx, 1, (int64_t[]){lane}));
    MlirType t = mlirShapedTypeGetElementType(mlirValueGetType(v));
    return mlirOperationGetResult(cg_op(b, "vector.extract", 1, &v, 1, &t, 1, &a), 0);
}

MlirValue cg_cvt_bf16x32(cg_b *b, MlirValue lo, MlirValue hi, bool interleave) {
    static const char name[] = "llvm.x86.avx512bf16.cvtne2ps2bf16.512";
    MlirType vf = cg_vec_t(16, b->f32), vb = cg_vec_t(32, mlirBF16TypeGet(b->ctx));
    if (!b->cvtbf16_declared) {
        MlirType in[2] = {vf, vf};
        declare_func(b, name, mlirFunctionTypeGet(b->ctx, 2, in, 1, &vb));
        b->cvtbf16_declared = true;
    }
    /* vcvtne2ps2bf16: its second operand's 16 values in the low half */
    MlirValue args[2] = {hi, lo};
    MlirValue v = cg_vbitcast(b, call(b, name, 2, args, vb), cg_vec_t(32, b->i16));
    if (interleave) {
        int64_t lanes[32];
        for (int64_t l = 0; l < 32; l++)
            lanes[l] = l % 2 == 0 ? l / 2 : 16 + l / 2;
        v = cg_vshuffle(b, v, v, 32, lanes);
    }
    return cg_vbitcast(b, v, cg_vec_t(16, b->i32));
}

MlirValue cg_dpbf16(cg_b *b, MlirValue acc, MlirValue a, MlirValue bv) {
    /* a declaration named after the intrinsic becomes the intrinsic in LLVM IR */
    static const char name[] = "llvm.x86.avx512bf16.dpbf16ps.512";
    MlirType vf = cg_vec_t(16, b->f32), vb = cg_vec_t(32, mlirBF16TypeGet(b->ctx));
    if (!b->dpbf16_declared) {
        MlirType in[3] = {vf, vb, vb};
        declare_func(b, name, mlirFunctionTypeGet(b->ctx, 3, in, 1, &vf));
        b->dpbf16_declared = true;
    }
    MlirValue args[3] = {acc, cg_vbitcast(b, a, vb), cg_vbitcast(b, bv, vb)};
    return call(b, name, 3, args, vf);
}
