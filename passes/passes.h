/* Loom passes: graph-to-graph rewrites run in order by the pass manager. */
#ifndef LOOM_PASSES_PASSES_H
#define LOOM_PASSES_PASSES_H

#include "ir/ir.h"

/* A pass rewrites g in place and says whether it changed anything. */
typedef struct loom_pass {
    const char *name;
    loom_status (*run)(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d);
} loom_pass;

typedef struct loom_pass_options {
    bool verify_each; /* run the verifier after every pass (tests, debug builds) */
    /* called after each pass with the graph (dumps); may be NULL */
    void (*after_pass)(const char *pass_name, bool changed, const loom_ir_graph *g, void *ud);
    void *ud;
} loom_pass_options;

/* Runs the passes in order. A pass error or a verifier failure stops the pipeline; the
 * message names the pass. */
loom_status loom_pass_run_pipeline(loom_ir_graph *g, const loom_pass *const *passes,
                                   int32_t n_passes, const loom_pass_options *opts,
                                   loom_ir_diag *d);

/* The pass with this name, or NULL. */
const loom_pass *loom_pass_find(const char *name);

/* Dead-code elimination: drops nodes no output depends on (graph inputs stay). */
extern const loom_pass loom_pass_dce;

#endif
