/* The executable cache: a bounded LRU keyed by structural hash. A hash match is confirmed
 * by structural equality so a collision can never run the wrong program. */
#include "runtime.h"

void loom_rt_cache_init(loom_rt_cache *c, const loom_allocator *a, int32_t max_entries,
                        loom_rt_metrics *metrics) {
    *c = (loom_rt_cache){.alloc = *a, .max_entries = max_entries > 0 ? max_entries : 1,
                         .metrics = metrics};
}

void loom_rt_cache_deinit(loom_rt_cache *c) {
    for (int32_t i = 0; i < c->n; i++)
        loom_rt_executable_destroy(c->entries[i].exe);
    loom_ir_free(&c->alloc, c->entries, (size_t)c->cap * sizeof *c->entries);
    c->entries = NULL;
    c->n = c->cap = 0;
}

loom_rt_executable *loom_rt_cache_find(loom_rt_cache *c, const loom_ir_graph *g, uint64_t hash) {
    for (int32_t i = 0; i < c->n; i++) {
        loom_rt_cache_entry *e = &c->entries[i];
        if (e->exe->hash == hash && loom_ir_graph_equal(&e->exe->graph, g)) {
            e->last_use = ++c->clock;
            return e->exe;
        }
    }
    return NULL;
}

loom_status loom_rt_cache_insert(loom_rt_cache *c, loom_rt_executable *exe) {
    if (c->n == c->max_entries) {
        int32_t victim = 0;
        for (int32_t i = 1; i < c->n; i++)
            if (c->entries[i].last_use < c->entries[victim].last_use)
                victim = i;
        loom_rt_executable_destroy(c->entries[victim].exe);
        c->entries[victim] = c->entries[--c->n];
        if (c->metrics)
            loom_rt_metrics_add(c->metrics, LOOM_RT_METRIC_CACHE_EVICTIONS, 1);
    }
    if (!loom_ir_grow(&c->alloc, (void **)&c->entries, &c->cap, c->n + 1, sizeof *c->entries)) {
        loom_rt_executable_destroy(exe);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    c->entries[c->n++] = (loom_rt_cache_entry){.exe = exe, .last_use = ++c->clock};
    return LOOM_OK;
}
