/* The matmul schedule: tiling and vectorization of linalg matmuls through MLIR's transform
 * dialect (TOOLCHAIN.md: tile, vectorize, lower contractions to outer products, fold
 * memref aliases, CSE, hoist transfers), applied inside the codegen pipeline. */
#ifndef LOOM_CODEGEN_MATMUL_SCHEDULE_H
#define LOOM_CODEGEN_MATMUL_SCHEDULE_H

#include <mlir-c/IR.h>

#include "ir/ir.h"

/* Rewrites every linalg.matmul and linalg.batch_matmul (f32, static shapes, on memrefs) in
 * module into tiled, vectorized loops. Must run before the lowering to the LLVM dialect.
 * Errors: INTERNAL with MLIR's diagnostic in d. */
loom_status loom_cg_schedule_matmuls(MlirModule module, loom_ir_diag *d);

#endif
