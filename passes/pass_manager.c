/* The pass manager: runs passes in order, verifying after each on request. */
#include <string.h>

#include "passes.h"

static const loom_pass *const all_passes[] = {&loom_pass_dce};

const loom_pass *loom_pass_find(const char *name) {
    for (size_t i = 0; i < sizeof all_passes / sizeof all_passes[0]; i++)
        if (strcmp(all_passes[i]->name, name) == 0)
            return all_passes[i];
    return NULL;
}

loom_status loom_pass_run_pipeline(loom_ir_graph *g, const loom_pass *const *passes,
                                   int32_t n_passes, const loom_pass_options *opts,
                                   loom_ir_diag *d) {
    for (int32_t i = 0; i < n_passes; i++) {
        bool changed = false;
        loom_ir_diag sub;
        loom_ir_diag_init(&sub);
        loom_status st = passes[i]->run(g, &changed, &sub);
        if (st == LOOM_OK && opts && opts->verify_each)
            st = loom_ir_graph_verify(g, &sub);
        if (st != LOOM_OK) {
            if (d && d->code == LOOM_OK)
                d->node = sub.node;
            return loom_ir_diag_set(d, st, "pass %s: %s", passes[i]->name, sub.msg);
        }
        if (opts && opts->after_pass)
            opts->after_pass(passes[i]->name, changed, g, opts->ud);
    }
    return LOOM_OK;
}
