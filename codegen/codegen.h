/* Loom codegen: lowering of IR graphs through MLIR and LLVM. The only layer that includes
 * mlir-c/ or llvm-c/ headers; nothing of theirs appears in this header. */
#ifndef LOOM_CODEGEN_CODEGEN_H
#define LOOM_CODEGEN_CODEGEN_H

#include "ir/ir.h"
#include "ir/plan.h"
#include "runtime/kernel.h"

/* Creates an MLIR context with every dialect registered, builds a one-function module
 * (func.func @loom_smoke(f32, f32) -> f32 computing arith.addf) through the op builders,
 * verifies it and tears everything down. Proves the MLIR C API is linked and working.
 * On success, if out_text is not NULL, the printed module is appended to it. */
loom_status loom_cg_mlir_smoke(loom_ir_sbuf *out_text, loom_ir_diag *d);

/* The LLVM version the codegen layer was built against ("19.1.x"). */
const char *loom_cg_llvm_version(void);

/* ---- compiling plans --------------------------------------------------------------------- */

/* JIT'd code for one plan: owns the LLVM ORC JIT holding its kernels. */
typedef struct loom_cg_code loom_cg_code;

typedef struct loom_cg_options {
    int32_t compile_threads; /* modules compiled in parallel; <= 0: loom_rt_default_threads() */
    const char *dump_dir;    /* when set: MLIR before/after lowering, LLVM IR and assembly */
    const char *dump_prefix; /* dump file name prefix, e.g. "step000003-0123456789abcdef" */
    struct loom_rt_trace *trace; /* when set: an event per module compiled, on its thread */
} loom_cg_options;

/* Compiles every kernel of plan (for graph g) for the host CPU (features detected at run
 * time) into one JIT. out_kernels gets plan->n_kernels entries (function, extent, grain);
 * COLLECTIVE kernels get no code (fn NULL, extent and grain 1): the runtime runs them;
 * *out_code owns the code they point into. Errors: UNSUPPORTED (an op or dtype codegen
 * cannot lower yet: the message names it), INTERNAL (MLIR/LLVM failed), OUT_OF_MEMORY.
 *
 * Every op of ops.def is supported in every dtype it accepts, with the interpreter's
 * semantics: integer ops wrap, x / 0 == 0 and INT_MIN / -1 == INT_MIN, float -> int casts
 * saturate (NaN -> 0), 16-bit floats are computed in f32 and rounded after every node.
 * Differences within float tolerance: f32 exp/log/tanh/sigmoid/gelu are polynomial
 * approximations (relative error at most 2.5e-7, 2.5e-7, 3e-7, 4e-7 and 1e-6, checked by
 * the tests over dense sweeps; about 1, 1, 1.3, 2.6 and 6 ulp); f32 matmuls
 * accumulate in f32 (the interpreter in double); float sums accumulate in f64 in another
 * order. 16-bit matmuls accumulate in f32 and round once (vdpbf16ps on AVX512-BF16 for
 * bf16, else operands converted to f32 while packed; see loom_cg_target_key). What codegen
 * refuses (UNSUPPORTED): an operand of an f32/f64/integer matmul computed inside the
 * matmul's own kernel (16-bit matmuls evaluate theirs while packing), a reshape inside a kernel, a
 * reduction or matmul that is not its kernel's root, an epilogue result whose shape is not the
 * reduced value's / the product's. Kernels assume that no result buffer overlaps an arg buffer of
 * the same kernel.
 *
 * Kernels of the same structure (loom_ir_plan_share_kernels: a ResNet's repeated blocks)
 * are compiled once and share one function (LOOM_CG_SHARE=0: each is compiled on its own).
 *
 * Memory comes from g's allocator (used under a lock by the compile threads). Thread-safe:
 * several compiles may run at once, and kernels are reentrant. Environment:
 * LOOM_CG_TIMING=1 prints each compile's phase times to stderr; LOOM_CG_VERIFY=1 verifies the
 * MLIR after each lowering pass (by default only before the first); LOOM_CG_FMA=0 makes the
 * math polynomials avoid fused multiply-add (the path of hosts without it, for tests);
 * LOOM_MATMUL_ISA forces a matmul path: avx512 | avx2 | generic (f32 register tiles),
 * avx512bf16 | f32 | amx (16-bit matmuls; one the CPU lacks, and amx, not implemented yet,
 * warn once on stderr and fall back to f32). */
loom_status loom_cg_compile(const loom_ir_graph *g, const loom_ir_plan *plan,
                            const loom_cg_options *opts, loom_cg_code **out_code,
                            loom_rt_kernel *out_kernels, loom_ir_diag *d);
/* What loom_cg_compile checks before it builds anything: that codegen can lower every
 * kernel of plan (each op in its dtype, the shapes and fusions it handles), without MLIR or
 * LLVM, in well under a millisecond per kernel. Errors as loom_cg_compile's: UNSUPPORTED
 * (naming the node, op and type), INTERNAL (a malformed plan), OUT_OF_MEMORY. */
loom_status loom_cg_check(const loom_ir_graph *g, const loom_ir_plan *plan, loom_ir_diag *d);

/* How a matmul whose operands have the 16-bit float dtype dt is computed on this CPU (as
 * loom_cg_compile would now, LOOM_MATMUL_ISA included), e.g. "avx512bf16: vdpbf16ps, f32
 * accumulation"; NULL for any other dtype. And why the AMX-BF16 path does not run here (NULL
 * once it does). Static strings. */
const char *loom_cg_matmul16_path(loom_dtype dt);
const char *loom_cg_amx_missing(void);

/* Accepts NULL. Usable as loom_rt_program_create's release_code (cast through void *). */
void loom_cg_code_destroy(loom_cg_code *code);
void loom_cg_code_release(void *code);

/* The code as one self-describing blob (object file plus kernel table) for the disk cache,
 * appended to out; and the reverse. load checks the blob's structure, its checksum (which
 * covers the machine code), that it was compiled for this target (loom_cg_target_key) and
 * that its kernel table matches plan's kernels (the same count, code for every kernel but
 * the COLLECTIVE ones); any mismatch is CORRUPT_DATA, never a crash. The loaded
 * code is allocated with the system allocator. Errors: CORRUPT_DATA, INTERNAL,
 * OUT_OF_MEMORY. */
loom_status loom_cg_code_serialize(const loom_cg_code *code, loom_ir_sbuf *out, loom_ir_diag *d);
loom_status loom_cg_code_load(const void *blob, size_t len, const loom_ir_plan *plan,
                              loom_cg_code **out_code, loom_rt_kernel *out_kernels,
                              loom_ir_diag *d);

/* Fills kernels[k].code_bytes, for each of the n_kernels kernels of code (as built or
 * loaded), with the size of its machine code, from the object files' symbol tables (ELF's
 * st_size); kernels sharing code get the same size, and kernels without code keep 0. For
 * perf's map and jitdump (loom_rt_program_perf_map, _jitdump): the JIT has no use for it. */
void loom_cg_code_sizes(const loom_cg_code *code, int32_t n_kernels, loom_rt_kernel *kernels);

/* What compiled code depends on besides the graph, for cache keys: LLVM version, target
 * triple, host CPU name, the enabled host features and codegen's own format version, e.g.
 * "llvm-19.1.7;x86_64-pc-linux-gnu;znver5;+avx,+avx2,...;cg1;build-...;mm-auto" (about 600
 * characters on an AVX-512 machine; the last field is LOOM_MATMUL_ISA, sanitized, or "auto").
 * Never NULL; valid until the calling thread's next call. */
const char *loom_cg_target_key(void);

#endif
