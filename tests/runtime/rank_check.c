/* The per-rank check helpers of rank_check.h. */
#include "rank_check.h"

int rank_, checks, failures;

loom_context *new_context(bool eager) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    o.cache_dir = "";
    loom_context *ctx = NULL;
    CHECK(loom_context_create(&o, &ctx) == LOOM_OK, "context");
    return ctx;
}
