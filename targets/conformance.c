/* Conformance of the npu target on a graph (one-op samples from ir/samples.h, or any graph):
 * its JIT's results against the reference interpreter's on random inputs. The conformance
 * test and `loom-ir ops` run it; what the JIT takes is the npu target's supports. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kernel.h"
#include "targets.h"

/* The first element of output o where got and want differ beyond s's tolerance, as an
 * INTERNAL error naming it; LOOM_OK when none does. NaN matches NaN. */
static loom_status compare(const loom_ir_graph *g, int32_t o, const void *got, const void *want,
                           const loom_ir_sample *s, loom_ir_diag *d) {
    const loom_ir_node *n = &g->nodes[g->outputs[o].node];
    int64_t count = loom_ir_numel(n->rank, n->shape);
    for (int64_t i = 0; i < count; i++) {
        double w = loom_ir_load_f64(want, n->dtype, i), x = loom_ir_load_f64(got, n->dtype, i);
        if ((isnan(w) && isnan(x)) || w == x)
            continue;
        double err = fabs(w - x), lim = s->abs_tol + s->rel_tol * fabs(w);
        if (!(err <= lim)) {
            char ty[LOOM_IR_TYPE_STR_MAX];
            return loom_ir_diag_set(
                d, LOOM_STATUS_INTERNAL,
                "output %d (%s) element %lld: JIT %.17g, interpreter %.17g (error %.3g > %.3g)",
                (int)o, loom_ir_format_type(ty, sizeof ty, n->dtype, n->rank, n->shape),
                (long long)i, x, w, err, lim);
        }
    }
    return LOOM_OK;
}

loom_status loom_tg_check_against_ref(const loom_ir_graph *g, const loom_ir_sample *s,
                                      uint64_t *rng, struct loom_rt_pool *pool, loom_rt_device *dev,
                                      loom_rt_metrics *m, loom_ir_diag *d) {
    int32_t n_in = g->n_graph_inputs, n_out = g->n_outputs;
    loom_rt_buffer **ins = calloc((size_t)n_in + 1, sizeof *ins);
    loom_rt_buffer **outs = calloc((size_t)n_out + 1, sizeof *outs);
    void **in_ptrs = calloc((size_t)n_in + 1, sizeof *in_ptrs);
    void **want = calloc((size_t)n_out + 1, sizeof *want);
    loom_rt_executable *exe = NULL;
    loom_status st = ins && outs && in_ptrs && want ? LOOM_OK : LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int32_t k = (int32_t)n->attrs.index;
        st = loom_rt_buffer_alloc(dev, loom_ir_node_bytes(n) + 1, &ins[k]);
        if (st == LOOM_OK) {
            loom_ir_sample_fill(ins[k]->data, n->dtype, loom_ir_numel(n->rank, n->shape), s->lo,
                                s->hi, rng);
            in_ptrs[k] = ins[k]->data;
        }
    }
    for (int32_t o = 0; o < n_out && st == LOOM_OK; o++) {
        size_t bytes = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]) + 1;
        st = loom_rt_buffer_alloc(dev, bytes, &outs[o]);
        if (st == LOOM_OK && !(want[o] = calloc(1, bytes)))
            st = LOOM_STATUS_OUT_OF_MEMORY;
    }
    if (st != LOOM_OK) {
        st = loom_ir_diag_set(d, st, "out of memory for the inputs and outputs");
    } else if ((st = loom_rt_interp_run(g, &g->alloc, (const void *const *)in_ptrs, want, d)) !=
               LOOM_OK) {
        d->code = st; /* the message names the node */
    } else if (pool) {
        /* the interpreter first: the JIT may write outputs into donated inputs */
        loom_rt_build_options o = {.compile_threads = loom_rt_pool_threads(pool),
                                   .verify_passes = true};
        loom_tg_register_builtin();
        const loom_rt_target *npu = loom_rt_target_find("npu");
        st = npu->build(g, loom_ir_graph_hash(g), &o, pool, &g->alloc, m, &exe, d);
        if (st == LOOM_OK)
            st = exe->vt->run(exe, ins, outs, d);
        for (int32_t o2 = 0; o2 < n_out && st == LOOM_OK; o2++)
            st = compare(g, o2, outs[o2]->data, want[o2], s, d);
    }
    loom_rt_executable_destroy(exe);
    for (int32_t k = 0; k < n_in; k++)
        loom_rt_buffer_release(ins ? ins[k] : NULL);
    for (int32_t o = 0; o < n_out; o++) {
        loom_rt_buffer_release(outs ? outs[o] : NULL);
        free(want ? want[o] : NULL);
    }
    free(ins);
    free(outs);
    free(in_ptrs);
    free(want);
    return st;
}
