/* MLIR context set-up for codegen, and a smoke build of one function through the C API. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Arith.h>
#include <mlir-c/Dialect/Func.h>
#include <mlir-c/IR.h>
#include <mlir-c/RegisterEverything.h>

#include <string.h>

#include "cg_internal.h"

loom_status loom_cg_mlir_smoke(loom_ir_sbuf *out_text, loom_ir_diag *d) {
    MlirContext ctx = mlirContextCreate();
    MlirDialectRegistry reg = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(reg);
    mlirContextAppendDialectRegistry(ctx, reg);
    mlirDialectRegistryDestroy(reg);
    mlirContextLoadAllAvailableDialects(ctx);

    MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(ctx));
    cg_b b;
    cg_b_init(&b, ctx, module);
    MlirType args[2] = {b.f32, b.f32};
    MlirLocation arg_locs[2] = {b.loc, b.loc};
    MlirRegion body = mlirRegionCreate();
    MlirBlock block = mlirBlockCreate(2, args, arg_locs);
    mlirRegionAppendOwnedBlock(body, block);
    b.block = block; /* the body: x + y, returned */
    MlirValue sum =
        cg_bin(&b, "arith.addf", mlirBlockGetArgument(block, 0), mlirBlockGetArgument(block, 1));
    cg_op(&b, "func.return", 1, &sum, 0, NULL, 0, NULL);

    MlirNamedAttribute attrs[2] = {
        cg_named(&b, "sym_name",
                 mlirStringAttrGet(ctx, mlirStringRefCreateFromCString("loom_smoke"))),
        cg_named(&b, "function_type",
                 mlirTypeAttrGet(mlirFunctionTypeGet(ctx, 2, args, 1, &b.f32))),
    };
    MlirOperationState fn =
        mlirOperationStateGet(mlirStringRefCreateFromCString("func.func"), b.loc);
    mlirOperationStateAddAttributes(&fn, 2, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(module), mlirOperationCreate(&fn));

    MlirOperation mod_op = mlirModuleGetOperation(module);
    loom_status st = LOOM_OK;
    if (!mlirOperationVerify(mod_op))
        st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "MLIR smoke module failed to verify");
    else if (out_text)
        mlirOperationPrint(mod_op, cg_print_to_sbuf, out_text);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
    return st;
}
