/* Codegen internals shared by its files: the MLIR op builder, the polynomial math emitters,
 * the per-kernel lowering, the host target and the JIT. Never included outside codegen/. */
#ifndef LOOM_CODEGEN_CG_INTERNAL_H
#define LOOM_CODEGEN_CG_INTERNAL_H

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>
#include <llvm-c/TargetMachine.h>

#include "codegen.h"

/* Bumped whenever generated code or the blob layout changes: part of the target key, so a
 * disk cache never hands old code to a newer Loom. */
#define LOOM_CG_FORMAT_VERSION 2 /* 2: the blob checksum is XXH3 */

/* ---- MLIR op builder (mlir_build.c) -------------------------------------------------------
 * Ops are appended at the end of `block`; loops and ifs move it into their bodies and back.
 * Every builder takes and returns plain MlirValues; results have the operand's type unless
 * the name says otherwise. */

typedef struct cg_b {
    MlirContext ctx;
    MlirModule module;
    MlirLocation loc;
    MlirBlock block;
    MlirType index, i1, i8, i16, i32, i64, f16, f32, f64;
    uint32_t libm_declared; /* bit per cg_libm function already declared in module */
    bool dpbf16_declared;   /* the vdpbf16ps intrinsic is declared in module */
    bool cvtbf16_declared;  /* and the vcvtne2ps2bf16 one */
    uint8_t fence_declared; /* llvm.arithmetic.fence of vector<8/16/32xf32>: bits 0/1/2 */
    bool fma;               /* the host has fused multiply-add (math.fma is one instruction) */
} cg_b;

void cg_b_init(cg_b *b, MlirContext ctx, MlirModule module);
/* An MlirStringCallback appending to the loom_ir_sbuf passed as ud (module printing). */
void cg_print_to_sbuf(MlirStringRef s, void *ud);

MlirOperation cg_op(cg_b *b, const char *name, intptr_t n_operands, const MlirValue *operands,
                    intptr_t n_results, const MlirType *results, intptr_t n_attrs,
                    const MlirNamedAttribute *attrs);
MlirNamedAttribute cg_named(cg_b *b, const char *name, MlirAttribute attr);
/* One-result op without attributes. */
MlirValue cg_v(cg_b *b, const char *name, intptr_t n, const MlirValue *operands, MlirType result);

MlirValue cg_cf(cg_b *b, MlirType t, double v);  /* float constant */
MlirValue cg_ci(cg_b *b, MlirType t, int64_t v); /* integer (and i1, index) constant */
MlirValue cg_idx(cg_b *b, int64_t v);            /* index constant */

MlirValue cg_bin(cg_b *b, const char *name, MlirValue x, MlirValue y); /* result: x's type */
MlirValue cg_un(cg_b *b, const char *name, MlirValue x);
MlirValue cg_conv(cg_b *b, const char *name, MlirValue x, MlirType to);
MlirValue cg_fma(cg_b *b, MlirValue x, MlirValue y, MlirValue z); /* math.fma */
/* x * y + z: one fma when the host has it, else a multiply and an add. */
MlirValue cg_muladd(cg_b *b, MlirValue x, MlirValue y, MlirValue z);
MlirValue cg_select(cg_b *b, MlirValue c, MlirValue t, MlirValue f);

/* arith.cmpf / arith.cmpi predicates (their MLIR enum values). */
typedef enum cg_fpred {
    CG_F_OEQ = 1,
    CG_F_OGT = 2,
    CG_F_OGE = 3,
    CG_F_OLT = 4,
    CG_F_OLE = 5,
    CG_F_ONE = 6,
    CG_F_UGT = 9,
    CG_F_UNE = 13,
    CG_F_UNO = 14,
} cg_fpred;
typedef enum cg_ipred {
    CG_I_EQ = 0,
    CG_I_NE = 1,
    CG_I_SLT = 2,
    CG_I_SLE = 3,
    CG_I_SGT = 4,
    CG_I_SGE = 5,
    CG_I_ULT = 6,
    CG_I_UGT = 8,
} cg_ipred;
MlirValue cg_cmpf(cg_b *b, cg_fpred p, MlirValue x, MlirValue y);
MlirValue cg_cmpi(cg_b *b, cg_ipred p, MlirValue x, MlirValue y);

/* Index arithmetic that folds the trivial cases (x*1, x+0, 0*y) so address code stays small. */
MlirValue cg_iadd(cg_b *b, MlirValue x, MlirValue y);
MlirValue cg_imul_c(cg_b *b, MlirValue x, int64_t c);
MlirValue cg_imin(cg_b *b, MlirValue x, MlirValue y);

/* memref.load / memref.store on a 1-D memref. */
MlirValue cg_load(cg_b *b, MlirValue mem, MlirValue i);
void cg_store(cg_b *b, MlirValue v, MlirValue mem, MlirValue i);
/* One malloc'd 1-D buffer of n elements of t per call (the caller frees it at the end). */
MlirValue cg_alloc_buf(cg_b *b, MlirType t, int64_t n);

/* scf.for over [lb, ub) with step 1 and n_iter loop-carried values (<= 4). After begin, ops
 * go into the body; end yields and moves back after the loop. */
#define CG_MAX_ITER 24
typedef struct cg_for {
    MlirOperation op;
    MlirBlock parent;
    MlirValue iv;
    MlirValue iter[CG_MAX_ITER];
} cg_for;
void cg_for_begin(cg_b *b, cg_for *l, MlirValue lb, MlirValue ub, int n_iter,
                  const MlirValue *init);
void cg_for_end(cg_b *b, cg_for *l, int n_yield, const MlirValue *yield);
MlirValue cg_for_result(const cg_for *l, int i);

/* scf.if without results: begin enters the then-block; end returns after the op. */
typedef struct cg_if {
    MlirOperation op;
    MlirBlock parent;
} cg_if;
void cg_if_begin(cg_b *b, cg_if *f, MlirValue cond);
void cg_if_end(cg_b *b, cg_if *f);
/* scf.if with n results of types[] and both branches: cg_ifv_begin enters the then-block,
 * cg_ifv_else yields its n values and enters the else-block, cg_ifv_end yields the
 * else-block's and returns after the op (its results: cg_if_result). */
void cg_ifv_begin(cg_b *b, cg_if *f, MlirValue cond, int n, const MlirType *types);
void cg_ifv_else(cg_b *b, cg_if *f, int n, const MlirValue *yield);
void cg_ifv_end(cg_b *b, cg_if *f, int n, const MlirValue *yield);
MlirValue cg_if_result(const cg_if *f, int i);

/* f64 libm functions without an MLIR math lowering to an intrinsic. */
typedef enum cg_libm { CG_LIBM_TANH, CG_LIBM_ERF, CG_LIBM_COUNT_ } cg_libm;
MlirValue cg_call_libm(cg_b *b, cg_libm fn, MlirValue x);

/* vector dialect on 1-D memrefs: a vector of n elements of elem; load/store at index i. */
MlirType cg_vec_t(int64_t n, MlirType elem);
MlirValue cg_vload(cg_b *b, MlirType vt, MlirValue mem, MlirValue i);
void cg_vstore(cg_b *b, MlirValue v, MlirValue mem, MlirValue i);
MlirValue cg_vbroadcast(cg_b *b, MlirValue x, MlirType vt);
MlirValue cg_vbitcast(cg_b *b, MlirValue v, MlirType vt);
/* A constant vector<n x i32>; x <p> y lane by lane (a vector of i1); a load of the lanes mask
 * sets (zeros in the others, which touch no memory: AVX-512 masked moves) and a store of
 * them; lanes of x (0..k-1) and y (k..2k-1) picked into a vector of n (at most 64). */
MlirValue cg_vconst_i32(cg_b *b, int64_t n, const int32_t *lanes);
MlirValue cg_vcmpi(cg_b *b, cg_ipred p, MlirValue x, MlirValue y);
MlirValue cg_vcmpf(cg_b *b, cg_fpred p, MlirValue x, MlirValue y);
/* A hint to bring mem[i]'s cache line in for reading, or for writing (`write`), into every
 * cache level (`near`) or from L2 outwards (memref.prefetch; no fault, whatever i). */
void cg_prefetch(cg_b *b, MlirValue mem, MlirValue i, bool write, bool near);
MlirValue cg_vmaskload(cg_b *b, MlirType vt, MlirValue mem, MlirValue i, MlirValue mask);
/* The same with the other lanes set to scalar pass (of vt's element type). */
MlirValue cg_vmaskload_or(cg_b *b, MlirType vt, MlirValue mem, MlirValue i, MlirValue mask,
                          MlirValue pass);
void cg_vmaskstore(cg_b *b, MlirValue v, MlirValue mem, MlirValue i, MlirValue mask);
/* vector.gather: mem[idx[l]] (idx a vector of i32) where mask[l], else 0. */
MlirValue cg_vgather(cg_b *b, MlirType vt, MlirValue mem, MlirValue idx, MlirValue mask);
/* mem[at + i] = zero (a scalar) for i in [0, n) (an index; nothing where n <= 0): vectors
 * of 16 and one masked store for the rest. */
void cg_zero_range(cg_b *b, MlirValue mem, MlirValue at, MlirValue n, MlirValue zero);
MlirValue cg_vshuffle(cg_b *b, MlirValue x, MlirValue y, int64_t n, const int64_t *lanes);
/* v (a vector of 256, 512 or 1024 bits; other vectors are returned as they are) unchanged,
 * through llvm.arithmetic.fence: no instruction, but LLVM's instruction selection does not
 * combine the shuffles before it with those after it. Its X86 shuffle combining follows
 * chains of shuffles several levels deep: the 16 x 16 transposes' (4 levels of 32 shuffles)
 * were a fifth of a ResNet step's codegen time. Fenced after levels 1 and 2, they come out
 * as good (a ResNet step: 64 of its 6,025 shuffles fewer), the step's second DAG combine
 * 1.0 -> 0.33 s. */
MlirValue cg_vfence(cg_b *b, MlirValue v);
/* Transposes the 16 x 16 matrix of rows r[0..15] (vectors of 16) in place. */
void cg_vtranspose16(cg_b *b, MlirValue *r);
/* Lane `lane` of vector v, a scalar. */
MlirValue cg_vextract(cg_b *b, MlirValue v, int64_t lane);
/* The lanes of float vector v combined by kind ("add", "maximumf", ...; reassociable). */
MlirValue cg_vreduce(cg_b *b, const char *kind, MlirValue v);
/* acc + pairwise bf16 dot products (llvm.x86.avx512bf16.dpbf16ps.512, vdpbf16ps): acc is
 * vector<16xf32>, a and bv vector<16xi32> each holding 16 pairs of bf16 (low half first).
 * Only for hosts with AVX512-BF16. */
MlirValue cg_dpbf16(cg_b *b, MlirValue acc, MlirValue a, MlirValue bv);
/* 32 f32 (vector<16xf32> lo and hi) rounded to bf16 (vcvtne2ps2bf16: to nearest even, NaN
 * quiet, but denormals in and out flushed to zero, whatever MXCSR says) as vector<16xi32>:
 * lo's 16 then hi's (the 32 values in order, paired (0, 1), (2, 3), ...), or, interleaved,
 * the pairs (lo[l], hi[l]), lo in the low half. The packing of operands for vdpbf16ps,
 * where denormal bf16 would be lost to no one; only for hosts with AVX512-BF16. */
MlirValue cg_cvt_bf16x32(cg_b *b, MlirValue lo, MlirValue hi, bool interleave);

/* ---- vectorizable f32 math (math_approx.c) ------------------------------------------------
 * Polynomial approximations built from arith ops only (no calls), so LLVM's loop vectorizer
 * widens them. Accuracy against double-precision libm over the f32 range: exp, log within
 * 1 ulp, tanh 1.3 ulp, sigmoid 2.6 ulp, gelu 6.2 ulp (5e-7 relative); NaN and infinities
 * as libm. */
MlirValue cg_exp_f32(cg_b *b, MlirValue x); /* x: f32 or a vector of f32 */
MlirValue cg_log_f32(cg_b *b, MlirValue x);
MlirValue cg_tanh_f32(cg_b *b, MlirValue x);
MlirValue cg_sigmoid_f32(cg_b *b, MlirValue x);
MlirValue cg_gelu_f32(cg_b *b, MlirValue x);

/* ---- kernel lowering (lower_kernel.c) ---------------------------------------------------- */

/* Per-thread scratch sized to a graph: node-indexed tables reused by every kernel. */
typedef struct cg_scratch cg_scratch;
loom_status loom_cg_scratch_create(const loom_ir_graph *g, const loom_allocator *a,
                                   cg_scratch **out);
void loom_cg_scratch_destroy(cg_scratch *s);

/* Checks that kernel k can be lowered and computes its outer extent and grain, without
 * touching MLIR. Errors: UNSUPPORTED (names the op, dtype and kernel), INTERNAL (a plan
 * that breaks its rules). */
loom_status loom_cg_kernel_check(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k,
                                 cg_scratch *s, int64_t *out_extent, int64_t *out_grain,
                                 loom_ir_diag *d);

/* Appends to b's module `func.func @<name>(memref..., index lo, index hi)`: one flat memref
 * per kernel arg then per result (storage dtypes: bf16 as i16, bool as i8). use_linalg:
 * f32 matmuls as linalg.matmul for the matmul schedule (otherwise plain loops). */
loom_status loom_cg_kernel_emit(cg_b *b, const loom_ir_graph *g, const loom_ir_plan *plan,
                                int32_t k, const char *name, bool use_linalg, cg_scratch *s,
                                loom_ir_diag *d);

/* ---- matmul kernels (lower_matmul.c) ----------------------------------------------------- */

/* Whether kernel k's body contains a linalg.matmul when emitted with use_linalg. */
bool loom_cg_kernel_uses_linalg(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k);

/* ---- the host target (host_target.c) ----------------------------------------------------
 * One-time LLVM/MLIR initialisation (targets, passes); host CPU description; the code paths
 * chosen from it. (Also there: codegen.h's loom_cg_llvm_version, loom_cg_target_key,
 * loom_cg_matmul16_path and loom_cg_amx_missing.) */
void loom_cg_init_once(void);
const char *loom_cg_host_triple(void);
const char *loom_cg_host_cpu(void);
const char *loom_cg_host_features(void);
/* Whether the host has fma; LOOM_CG_FMA=0 in the environment says no (tests use it to
 * cover the code path of hosts without). */
bool loom_cg_host_has_fma(void);
/* Whether LLVM's host feature string enables feature (a name without '+', "avx512bf16"). */
bool loom_cg_host_has(const char *feature);

/* How 16-bit (bf16, f16) matmuls are computed. AVX512BF16: bf16 only, B packed in pairs and
 * vdpbf16ps; F32: operands converted to f32 while packed, then an FMA microkernel of
 * 16-lane vectors (every machine, though tuned for AVX-512; f16 always). Chosen by cost: on
 * AVX512-BF16 hosts where loom_cg_bf16_dot_gain is 1.5 or more (Zen 4 and 5: ~2; Intel
 * without AMX: ~1, where the f32 path is faster); LOOM_MATMUL_ISA=avx512bf16 | f32 | amx forces one
 * (a path this CPU cannot run, and amx, which is not implemented, print one warning and use F32;
 * the f32 tiles avx512 | avx2 | generic imply F32). Read at each compile; loom_cg_target_key
 * includes the variable. */
typedef enum cg_mm16 { CG_MM16_F32, CG_MM16_AVX512BF16, CG_MM16_COUNT_ } cg_mm16;
cg_mm16 loom_cg_mm16_path(void);
/* vdpbf16ps's FLOP/s over vfmadd231ps's on this CPU, measured once per process (~1 ms, by
 * the thread's CPU time, host_target.c); 0 where not measured (no AVX512-BF16, not x86-64). */
double loom_cg_bf16_dot_gain(void);
/* Whether large f32 matmuls run on that FMA microkernel (microkernel.c) rather than the
 * matmul schedule: on AVX-512 and AVX2+FMA hosts, unless LOOM_MATMUL_ISA forces the generic
 * tiles or a 16-bit path. */
bool loom_cg_f32_microkernel(void);
/* The accumulators (vectors of 16 f32) of the microkernel's C tile: 16 on AVX-512 hosts (16
 * of the 32 zmm registers), 6 elsewhere (a vector is a pair of AVX2's 16 ymm registers: the
 * 6 x 16 tile of AVX2 GEMMs, 12 ymm, leaves B's pair and A's broadcast unspilled);
 * LOOM_MATMUL_ISA=avx512 | avx2 forces one. */
int64_t loom_cg_mk_acc(void);
/* How convolutions compile, from LOOM_CONV (read at each compile; loom_cg_target_key includes
 * it): AUTO, the kernels with Winograd where it applies (conv_winograd.c); DIRECT, without
 * Winograd nor border classes; IM2COL, decomposed by passes/conv_decompose.c (which reads the
 * variable itself). */
typedef enum cg_conv_mode {
    CG_CONV_AUTO,
    CG_CONV_DIRECT,
    CG_CONV_IM2COL,
    CG_CONV_WINO2,  /* LOOM_CONV=winograd2: Winograd F(2x2, 3x3) only (conv_winograd.c) */
    CG_CONV_WINO4,  /* LOOM_CONV=winograd4: F(4x4, 3x3) under bf16 pairs too */
    CG_CONV_BORDER, /* LOOM_CONV=border: border classes wherever a quarter of the taps are
                     * padding (lower_conv.c), not only where they were measured faster */
} cg_conv_mode;
cg_conv_mode loom_cg_conv_mode(void);
/* A target machine for the host (triple, CPU, features; default codegen level, PIC, small
 * code model), owned by the caller (LLVMDisposeTargetMachine). *out is NULL on error:
 * INTERNAL (no LLVM target for the triple, or LLVM refused the machine). */
loom_status loom_cg_host_target_machine_create(LLVMTargetMachineRef *out, loom_ir_diag *d);

/* ---- JIT (jit.c) --------------------------------------------------------------------------- */

typedef struct cg_kernel_rec {
    char name[32];
    int64_t extent, grain;
} cg_kernel_rec;

/* Builds a code object: a fresh LLJIT holding the given object files (copied), with each
 * kernel's symbol looked up into out_kernels. objs/obj_lens are borrowed. Errors:
 * CORRUPT_DATA (an object LLVM rejects, a missing symbol), INTERNAL, OUT_OF_MEMORY. */
loom_status loom_cg_code_build(const loom_allocator *a, int32_t n_objs, const uint8_t *const *objs,
                               const size_t *obj_lens, int32_t n_kernels, const cg_kernel_rec *recs,
                               loom_cg_code **out_code, loom_rt_kernel *out_kernels,
                               loom_status bad_object_status, loom_ir_diag *d);

#endif
