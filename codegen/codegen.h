/* Loom codegen: lowering of IR graphs through MLIR and LLVM. The only layer that includes
 * mlir-c/ or llvm-c/ headers; nothing of theirs appears in this header. */
#ifndef LOOM_CODEGEN_CODEGEN_H
#define LOOM_CODEGEN_CODEGEN_H

#include "ir/ir.h"

/* Creates an MLIR context with every dialect registered, builds a one-function module
 * (func.func @loom_smoke(f32, f32) -> f32 computing arith.addf) through the op builders,
 * verifies it and tears everything down. Proves the MLIR C API is linked and working.
 * On success, if out_text is not NULL, the printed module is appended to it. */
loom_status loom_cg_mlir_smoke(loom_ir_sbuf *out_text, loom_ir_diag *d);

/* The LLVM version the codegen layer was built against ("19.1.x"). */
const char *loom_cg_llvm_version(void);

#endif
