/* The errors of kernel lowering, each naming the kernel (and the node and why): used by every
 * file of the lowering. */
#include "lower_internal.h"

loom_status cg_unsupported(kc *c, int32_t id, const char *why) {
    const loom_ir_node *n = &c->g->nodes[id];
    char t[LOOM_IR_TYPE_STR_MAX];
    return loom_ir_diag_set(c->d, LOOM_STATUS_UNSUPPORTED, "codegen: kernel %d: %%%d = %s : %s: %s",
                            (int)c->kid, (int)id, loom_ir_op_name(n->op),
                            loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape), why);
}

loom_status cg_bad_plan(kc *c, int32_t id, const char *why) {
    return loom_ir_diag_set(c->d, LOOM_STATUS_INTERNAL, "codegen: kernel %d: %%%d: %s", (int)c->kid,
                            (int)id, why);
}

loom_status cg_oom(kc *c) {
    return loom_ir_diag_set(c->d, LOOM_STATUS_OUT_OF_MEMORY,
                            "codegen: out of memory lowering kernel %d", (int)c->kid);
}
