/* Metrics: counters and timers in the spirit of PyTorch/XLA's metrics report. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

typedef enum metric_kind { KIND_COUNTER, KIND_TIMER } metric_kind;

static const struct {
    const char *name;
    metric_kind kind;
    const char *unit;
} metric_info[] = {
#define LOOM_METRIC(e, name, kind, unit) [LOOM_RT_METRIC_##e] = {name, KIND_##kind, unit},
#include "metrics.def"
#undef LOOM_METRIC
};
_Static_assert(sizeof metric_info / sizeof metric_info[0] == LOOM_RT_METRIC_COUNT_,
               "metrics table size");

void loom_rt_metrics_init(loom_rt_metrics *m) { memset(m, 0, sizeof *m); }

void loom_rt_metrics_add(loom_rt_metrics *m, loom_rt_metric which, int64_t v) {
    if (metric_info[which].kind == KIND_COUNTER) {
        m->count[which] += v;
        return;
    }
    if (m->count[which] == 0 || v < m->min[which])
        m->min[which] = v;
    if (m->count[which] == 0 || v > m->max[which])
        m->max[which] = v;
    m->count[which]++;
    m->total[which] += v;
    m->last[which] = v;
}

bool loom_rt_metric_is_timer(loom_rt_metric which) { return metric_info[which].kind == KIND_TIMER; }

loom_rt_metric loom_rt_metric_from_name(const char *name) {
    for (int i = 0; i < LOOM_RT_METRIC_COUNT_; i++)
        if (strcmp(metric_info[i].name, name) == 0)
            return (loom_rt_metric)i;
    return LOOM_RT_METRIC_COUNT_;
}

int64_t loom_rt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Human-readable durations as PyTorch/XLA prints them: 1.234ms, 56.7us. */
static void fmt_value(char *buf, size_t n, int64_t v, const char *unit) {
    if (strcmp(unit, "ns") != 0) {
        snprintf(buf, n, "%" PRId64 "%s%s", v, *unit ? " " : "", unit);
        return;
    }
    if (v >= 1000000000)
        snprintf(buf, n, "%.3fs", (double)v / 1e9);
    else if (v >= 1000000)
        snprintf(buf, n, "%.3fms", (double)v / 1e6);
    else if (v >= 1000)
        snprintf(buf, n, "%.3fus", (double)v / 1e3);
    else
        snprintf(buf, n, "%" PRId64 "ns", v);
}

loom_status loom_rt_metrics_report(const loom_rt_metrics *m, loom_report_format format,
                                   loom_ir_write_fn write, void *ud) {
    char line[512];
    if (format == LOOM_REPORT_FORMAT_JSON) {
        write("{", 1, ud);
        bool first = true;
        for (int i = 0; i < LOOM_RT_METRIC_COUNT_; i++) {
            int n;
            if (metric_info[i].kind == KIND_COUNTER)
                n = snprintf(line, sizeof line, "%s\"%s\":%" PRId64, first ? "" : ",",
                             metric_info[i].name, m->count[i]);
            else
                n = snprintf(line, sizeof line,
                             "%s\"%s\":{\"count\":%" PRId64 ",\"total\":%" PRId64
                             ",\"min\":%" PRId64 ",\"max\":%" PRId64 ",\"last\":%" PRId64
                             ",\"unit\":\"%s\"}",
                             first ? "" : ",", metric_info[i].name, m->count[i], m->total[i],
                             m->min[i], m->max[i], m->last[i], metric_info[i].unit);
            write(line, (size_t)n, ud);
            first = false;
        }
        write("}\n", 2, ud);
        return LOOM_OK;
    }
    for (int i = 0; i < LOOM_RT_METRIC_COUNT_; i++) {
        int n;
        if (metric_info[i].kind == KIND_COUNTER) {
            n = snprintf(line, sizeof line, "Counter: %s\n  Value: %" PRId64 "\n",
                         metric_info[i].name, m->count[i]);
        } else if (m->count[i] == 0) {
            n = snprintf(line, sizeof line, "Metric: %s\n  TotalSamples: 0\n", metric_info[i].name);
        } else {
            char tot[32], mn[32], mx[32], avg[32];
            const char *u = metric_info[i].unit;
            fmt_value(tot, sizeof tot, m->total[i], u);
            fmt_value(mn, sizeof mn, m->min[i], u);
            fmt_value(mx, sizeof mx, m->max[i], u);
            fmt_value(avg, sizeof avg, m->total[i] / m->count[i], u);
            n = snprintf(line, sizeof line,
                         "Metric: %s\n  TotalSamples: %" PRId64 "\n  Accumulator: %s\n"
                         "  Mean: %s\n  Min: %s\n  Max: %s\n",
                         metric_info[i].name, m->count[i], tot, avg, mn, mx);
        }
        write(line, (size_t)n, ud);
    }
    return LOOM_OK;
}
