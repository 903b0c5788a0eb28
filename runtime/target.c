/* The registry of targets (target.h). */
#include <pthread.h>
#include <string.h>

#include "target.h"

enum { MAX_TARGETS = 8 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const loom_rt_target *targets[MAX_TARGETS];
static int n_targets;

loom_status loom_rt_target_register(const loom_rt_target *t) {
    loom_status st = LOOM_OK;
    pthread_mutex_lock(&mu);
    bool known = false;
    for (int i = 0; i < n_targets && !known; i++)
        known = strcmp(targets[i]->name, t->name) == 0;
    if (!known) {
        if (n_targets < MAX_TARGETS)
            targets[n_targets++] = t;
        else
            st = LOOM_STATUS_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&mu);
    return st;
}

const loom_rt_target *loom_rt_target_find(const char *name) {
    const loom_rt_target *t = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_targets && !t && name; i++)
        if (strcmp(targets[i]->name, name) == 0)
            t = targets[i];
    pthread_mutex_unlock(&mu);
    return t;
}
