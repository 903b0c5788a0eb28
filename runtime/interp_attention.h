/* The reference interpreter's attention ops (interp_attention.c), called by interp.c. */
#ifndef LOOM_RUNTIME_INTERP_ATTENTION_H
#define LOOM_RUNTIME_INTERP_ATTENTION_H

#include "ir/ir.h"

/* Node n (an attention op) on its operand nodes x and values src into dst. */
loom_status loom_rt_interp_attention(const loom_ir_node *n, const loom_ir_node *const *x,
                                     const void *const *src, void *dst, const loom_allocator *a,
                                     loom_ir_diag *d);

#endif
