/* The op table (ops.def) and the kind table (kinds.def), expanded, and lookups by name. */
#include <string.h>

#include "ir.h"

const loom_ir_kind_info loom_ir_kind_table[LOOM_IR_KIND_COUNT_] = {
#define LOOM_KIND(e, n, ...) [LOOM_IR_KIND_##e] = {#n, __VA_ARGS__},
#include "kinds.def"
#undef LOOM_KIND
};

const loom_ir_op_info loom_ir_op_table[LOOM_IR_OP_COUNT_] = {
#define LOOM_OP(e, n, ar, k, dt, ac, fl, at)                                                       \
    [LOOM_IR_OP_##                                                                                 \
        e] = {#n, ar, LOOM_IR_KIND_##k, LOOM_IR_DT_##dt, LOOM_IR_AC_##ac, fl, LOOM_IR_ATTRS_##at},
#include "ops.def"
#undef LOOM_OP
};

const char *loom_ir_op_name(loom_ir_op op) {
    return (unsigned)op < LOOM_IR_OP_COUNT_ ? loom_ir_op_table[op].name : "?";
}

loom_ir_op loom_ir_op_from_name(const char *name, size_t len) {
    for (int i = 0; i < LOOM_IR_OP_COUNT_; i++) {
        const char *n = loom_ir_op_table[i].name;
        if (strlen(n) == len && memcmp(n, name, len) == 0)
            return (loom_ir_op)i;
    }
    return LOOM_IR_OP_COUNT_;
}

const char *loom_ir_reduce_op_name(int64_t op) {
    static const char *const names[LOOM_REDUCE_COUNT_] = {
        [LOOM_REDUCE_SUM] = "sum", [LOOM_REDUCE_MAX] = "max", [LOOM_REDUCE_MIN] = "min"};
    return op >= 0 && op < LOOM_REDUCE_COUNT_ ? names[op] : "?";
}

const char *loom_ir_kind_name(loom_ir_kind kind) {
    return (unsigned)kind < LOOM_IR_KIND_COUNT_ ? loom_ir_kind_table[kind].name : "?";
}

const char *loom_ir_autocast_name(loom_ir_autocast ac) {
    switch (ac) {
    case LOOM_IR_AC_NONE: return "none";
    case LOOM_IR_AC_LOWER: return "lower";
    case LOOM_IR_AC_FP32: return "fp32";
    case LOOM_IR_AC_PROMOTE: return "promote";
    case LOOM_IR_AC_COUNT_: break;
    }
    return "?";
}

bool loom_ir_op_is_elementwise(loom_ir_op op) {
    return (unsigned)op < LOOM_IR_OP_COUNT_ && loom_ir_op_traits(op)->loop;
}
