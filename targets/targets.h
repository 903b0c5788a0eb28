/* The built-in targets (runtime/target.h), above passes and codegen: "npu", whose compiler is
 * the codegen JIT (npu.c), and "ref", the reference interpreter (ref.c). */
#ifndef LOOM_TARGETS_H
#define LOOM_TARGETS_H

#include "ir/samples.h"
#include "runtime/target.h"

/* Registers every built-in target, once per process (later calls return at once).
 * Thread-safe. */
void loom_tg_register_builtin(void);

/* ---- npu.c, ref.c ---- */
/* The npu target's supports: whether codegen can lower g, its passes and plan, then
 * loom_cg_check (nothing compiled). Errors: UNSUPPORTED naming what codegen refuses; others
 * from the passes. */
loom_status loom_tg_npu_supports(const loom_ir_graph *g, loom_ir_diag *d);
loom_status loom_tg_register_npu(void);
loom_status loom_tg_register_ref(void);
/* The cache compares executables by the graph as traced, not as the passes rewrote it: *exe's
 * graph becomes a copy of cut. On failure *exe is destroyed and NULL. */
loom_status loom_tg_keep_traced_graph(loom_rt_executable **exe, const loom_ir_graph *cut,
                                      loom_ir_diag *d);

/* ---- conformance.c ---- */
/* Runs g on random inputs (from *rng, in s's domain, in buffers of dev) through the
 * reference interpreter and, unless pool is NULL, through the npu target's JIT built on pool, and
 * compares every output within s's tolerance. Errors: INTERNAL naming the first element that
 * differs ("output 0 (f32[3]) element 2: JIT ..., interpreter ..."), the interpreter's or
 * the JIT's errors (UNSUPPORTED when codegen refuses g), OUT_OF_MEMORY; the message in d. */
loom_status loom_tg_check_against_ref(const loom_ir_graph *g, const loom_ir_sample *s,
                                      uint64_t *rng, struct loom_rt_pool *pool, loom_rt_device *dev,
                                      loom_rt_metrics *m, loom_ir_diag *d);

#endif
