/* Shared test helpers: a failing, counting allocator. */
#include <stdlib.h>

#include "test_util.h"

static void *test_alloc_fn(void *ud, void *ptr, size_t old_size, size_t new_size) {
    test_alloc *ta = ud;
    if (new_size == 0) {
        if (ptr) {
            ta->live_bytes -= (int64_t)old_size;
            ta->live_blocks--;
        }
        free(ptr);
        return NULL;
    }
    if (!ptr || new_size > old_size) {
        ta->n_allocs++;
        if (ta->fail_at > 0 && ta->n_allocs == ta->fail_at) {
            ta->n_failed++;
            return NULL;
        }
    }
    void *p = realloc(ptr, new_size);
    if (!p)
        return NULL;
    if (!ptr)
        ta->live_blocks++;
    ta->live_bytes += (int64_t)new_size - (int64_t)(ptr ? old_size : 0);
    if (ta->live_bytes > ta->peak_bytes)
        ta->peak_bytes = ta->live_bytes;
    return p;
}

loom_allocator test_alloc_make(test_alloc *ta) {
    return (loom_allocator){.fn = test_alloc_fn, .ud = ta};
}
