/* MLIR context set-up for codegen, and a smoke build of one function through the C API. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Arith.h>
#include <mlir-c/Dialect/Func.h>
#include <mlir-c/IR.h>
#include <mlir-c/RegisterEverything.h>
#include <llvm-c/Core.h>

#include <stdio.h>
#include <string.h>

#include "codegen.h"

static void print_to_sbuf(MlirStringRef s, void *ud) { loom_ir_sbuf_append(ud, s.data, s.length); }

static MlirNamedAttribute named(MlirContext ctx, const char *name, MlirAttribute attr) {
    return mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString(name)), attr);
}

loom_status loom_cg_mlir_smoke(loom_ir_sbuf *out_text, loom_ir_diag *d) {
    MlirContext ctx = mlirContextCreate();
    MlirDialectRegistry reg = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(reg);
    mlirContextAppendDialectRegistry(ctx, reg);
    mlirDialectRegistryDestroy(reg);
    mlirContextLoadAllAvailableDialects(ctx);

    MlirLocation loc = mlirLocationFileLineColGet(ctx, mlirStringRefCreateFromCString("smoke"), 1, 1);
    MlirModule module = mlirModuleCreateEmpty(loc);
    MlirType f32 = mlirF32TypeGet(ctx);
    MlirType args[2] = {f32, f32};
    MlirType fn_type = mlirFunctionTypeGet(ctx, 2, args, 1, &f32);

    MlirRegion body = mlirRegionCreate();
    MlirLocation arg_locs[2] = {loc, loc};
    MlirBlock block = mlirBlockCreate(2, args, arg_locs);
    mlirRegionAppendOwnedBlock(body, block);

    MlirOperationState add = mlirOperationStateGet(mlirStringRefCreateFromCString("arith.addf"), loc);
    MlirValue operands[2] = {mlirBlockGetArgument(block, 0), mlirBlockGetArgument(block, 1)};
    mlirOperationStateAddOperands(&add, 2, operands);
    mlirOperationStateAddResults(&add, 1, &f32);
    MlirOperation add_op = mlirOperationCreate(&add);
    mlirBlockAppendOwnedOperation(block, add_op);

    MlirOperationState ret = mlirOperationStateGet(mlirStringRefCreateFromCString("func.return"), loc);
    MlirValue result = mlirOperationGetResult(add_op, 0);
    mlirOperationStateAddOperands(&ret, 1, &result);
    mlirBlockAppendOwnedOperation(block, mlirOperationCreate(&ret));

    MlirOperationState fn = mlirOperationStateGet(mlirStringRefCreateFromCString("func.func"), loc);
    MlirNamedAttribute attrs[2] = {
        named(ctx, "sym_name", mlirStringAttrGet(ctx, mlirStringRefCreateFromCString("loom_smoke"))),
        named(ctx, "function_type", mlirTypeAttrGet(fn_type)),
    };
    mlirOperationStateAddAttributes(&fn, 2, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    MlirOperation fn_op = mlirOperationCreate(&fn);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(module), fn_op);

    MlirOperation mod_op = mlirModuleGetOperation(module);
    loom_status st = LOOM_OK;
    if (!mlirOperationVerify(mod_op))
        st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "MLIR smoke module failed to verify");
    else if (out_text)
        mlirOperationPrint(mod_op, print_to_sbuf, out_text);
    mlirModuleDestroy(module);
    mlirContextDestroy(ctx);
    return st;
}

const char *loom_cg_llvm_version(void) {
    static char buf[32];
    unsigned major, minor, patch;
    LLVMGetVersion(&major, &minor, &patch);
    snprintf(buf, sizeof buf, "%u.%u.%u", major, minor, patch);
    return buf;
}
