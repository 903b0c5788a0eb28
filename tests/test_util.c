/* Shared test helpers: a failing, counting allocator, graph-building shorthands and plans. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "passes/passes.h"

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

int32_t tu_add_desc(loom_ir_graph *g, loom_ir_node_desc desc) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id = -1;
    loom_status st = loom_ir_graph_add(g, &desc, &id, &d);
    if (st != LOOM_OK)
        fail_msg("adding %s: %s: %s", loom_ir_op_name(desc.op), loom_status_name(st), d.msg);
    return id;
}

int32_t tu_add(loom_ir_graph *g, loom_ir_op op, int32_t n_in, const int32_t *in, loom_dtype dt,
               int32_t rank, const int64_t *shape, loom_ir_attrs attrs) {
    return tu_add_desc(g, (loom_ir_node_desc){.op = op,
                                              .n_inputs = n_in,
                                              .inputs = in,
                                              .dtype = dt,
                                              .rank = rank,
                                              .shape = shape,
                                              .attrs = attrs});
}

int32_t tu_input(loom_ir_graph *g, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return tu_add(g, LOOM_IR_OP_INPUT, 0, NULL, dt, rank, shape,
                  (loom_ir_attrs){.index = g->n_graph_inputs});
}

void tu_output(loom_ir_graph *g, int32_t node, int32_t alias) {
    assert_int_equal(loom_ir_graph_add_output(g, node, alias), LOOM_OK);
}

void tu_verify(const loom_ir_graph *g) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_verify(g, &d) != LOOM_OK)
        fail_msg("verify: %s (node %d)", d.msg, (int)d.node);
}

size_t tu_node_bytes(const loom_ir_node *n) {
    return (size_t)loom_ir_numel(n->rank, n->shape) * loom_dtype_size(n->dtype);
}

const char *tu_output_list(const loom_ir_graph *g) {
    static char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t o = 0; o < g->n_outputs && n < sizeof buf; o++) {
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%%%d", o ? "," : "",
                              (int)g->outputs[o].node);
        if (g->outputs[o].alias >= 0 && n < sizeof buf)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "->%d", (int)g->outputs[o].alias);
    }
    return buf;
}

loom_context *tu_context_alloc(bool eager, test_alloc *ta) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.dump_dir = NULL;
    o.eager = eager;
    if (ta)
        o.allocator = test_alloc_make(ta);
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

loom_context *tu_context(bool eager) {
    return tu_context_alloc(eager, NULL);
}

loom_tensor *tu_f32(loom_context *ctx, int64_t n, const float *v) {
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, n > 0 ? 1 : 0, &n, v);
    if (!t)
        fail_msg("tensor from host: %s", loom_context_error_message(ctx));
    return t;
}

loom_tensor *tu_scalar_f32(loom_context *ctx, float v) {
    return tu_f32(ctx, 0, &v);
}

void tu_read_f32(loom_context *ctx, loom_tensor *t, float *out, size_t n) {
    if (loom_tensor_read(ctx, t, out, n * sizeof *out) != LOOM_OK)
        fail_msg("%s", loom_context_error_message(ctx));
}

char *tu_read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *s = NULL;
    long n = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (n >= 0 && fseek(fp, 0, SEEK_SET) == 0 && (s = malloc((size_t)n + 1))) {
        size_t got = fread(s, 1, (size_t)n, fp);
        s[got] = '\0';
    }
    fclose(fp);
    return s;
}

bool tu_mapped_executable(uintptr_t lo, uintptr_t hi, const char *path) {
    FILE *f = fopen("/proc/self/maps", "r"); /* its size reads as 0: line by line */
    if (!f)
        return false;
    char line[4608];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3 && strncmp(perms, "r-x", 3) == 0)
            found = path ? strstr(line, path) != NULL : lo >= a && hi <= b;
    }
    fclose(f);
    return found;
}

int tu_runtime_setup(tu_runtime *r) {
    r->alloc = loom_allocator_system();
    loom_rt_metrics_init(&r->metrics);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_pool_create(2, &r->alloc, &r->pool) != LOOM_OK)
        return -1;
    return loom_rt_device_create("npu:0", &r->alloc, &r->metrics, &r->dev, &d) == LOOM_OK ? 0 : -1;
}

void tu_runtime_teardown(tu_runtime *r) {
    loom_rt_pool_destroy(r->pool);
    loom_rt_device_destroy(r->dev);
}

/* ---- plans ---------------------------------------------------------------------------- */

void tu_parse(loom_ir_graph *g, const char *text) {
    loom_allocator sys = loom_allocator_system();
    loom_ir_graph_init(g, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_parse(g, text, strlen(text), &d) != LOOM_OK)
        fail_msg("parse: %d:%d: %s", (int)d.line, (int)d.col, d.msg);
}

void tu_expect_no_overlap(const loom_ir_graph *g, const loom_ir_plan *p) {
    int32_t *first = malloc((size_t)g->n_nodes * sizeof *first);
    int32_t *last = malloc((size_t)g->n_nodes * sizeof *last);
    for (int32_t i = 0; i < g->n_nodes; i++)
        first[i] = last[i] = -1;
    for (int32_t k = 0; k < p->n_kernels; k++) {
        for (int32_t r = 0; r < p->kernels[k].n_results; r++)
            first[p->kernels[k].results[r]] = last[p->kernels[k].results[r]] = k;
        for (int32_t a = 0; a < p->kernels[k].n_args; a++) {
            int32_t b = p->kernels[k].args[a];
            while (g->nodes[b].op == LOOM_IR_OP_RESHAPE)
                b = g->nodes[b].inputs[0];
            last[b] = k;
        }
    }
    for (int32_t c = 0; c < p->n_copies; c++) {
        int32_t b = p->copies[c].node;
        while (g->nodes[b].op == LOOM_IR_OP_RESHAPE)
            b = g->nodes[b].inputs[0];
        last[b] = p->n_kernels;
    }
    for (int32_t x = 0; x < g->n_nodes; x++)
        for (int32_t y = x + 1; y < g->n_nodes; y++) {
            const loom_ir_placement *px = &p->placement[x], *py = &p->placement[y];
            if (first[x] < 0 || first[y] < 0 || !p->has_placement[x] || !p->has_placement[y] ||
                px->kind != LOOM_IR_BUFFER_ARENA || py->kind != LOOM_IR_BUFFER_ARENA)
                continue;
            bool time = first[x] <= last[y] && first[y] <= last[x];
            bool space = px->offset < py->offset + py->bytes && py->offset < px->offset + px->bytes;
            /* a scatter's sums in the block of the base that dies at it (test_memplan) */
            bool reuse = last[x] == first[y] && px->offset == py->offset &&
                         px->bytes == py->bytes && p->kernels[first[y]].root == y &&
                         loom_ir_plan_scatter_base(p, g, first[y]) == x;
            if (time && space && !reuse)
                fail_msg("%%%d and %%%d overlap in the arena while both alive", (int)x, (int)y);
        }
    free(first);
    free(last);
}

void tu_fuse_ok(const loom_ir_graph *g, loom_ir_plan *p) {
    loom_allocator sys = loom_allocator_system();
    loom_ir_plan_init(p, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_pass_fuse(g, p, &d) != LOOM_OK)
        fail_msg("fuse: %s", d.msg);
    if (loom_pass_plan_memory(g, p, &d) != LOOM_OK)
        fail_msg("plan memory: %s", d.msg);
    if (loom_ir_plan_verify(p, g, &d) != LOOM_OK)
        fail_msg("plan verify: %s", d.msg);
    tu_expect_no_overlap(g, p);
}

static void put_list(char *buf, size_t size, size_t *n, const int32_t *v, int32_t count) {
    for (int32_t i = 0; i < count && *n < size; i++)
        *n += (size_t)snprintf(buf + *n, size - *n, i ? " %d" : "%d", (int)v[i]);
}

const char *tu_plan_str(const loom_ir_plan *p) {
    static char buf[4096];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t k = 0; k < p->n_kernels && n < sizeof buf; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%c{", k ? " | " : "", "ERM"[kn->kind]);
        put_list(buf, sizeof buf, &n, kn->nodes, kn->n_nodes);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "}<-{");
        put_list(buf, sizeof buf, &n, kn->args, kn->n_args);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "}->{");
        put_list(buf, sizeof buf, &n, kn->results, kn->n_results);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "}");
    }
    return buf;
}

const char *tu_placement_str(const loom_ir_plan *p, const loom_ir_graph *g) {
    static char buf[2048];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < g->n_nodes && n < sizeof buf; i++) {
        if (!p->has_placement[i])
            continue;
        const loom_ir_placement *pl = &p->placement[i];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%%%d:", n ? " " : "", (int)i);
        if (pl->kind == LOOM_IR_BUFFER_INPUT)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "in%d", (int)pl->index);
        else if (pl->kind == LOOM_IR_BUFFER_OUTPUT)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "out%d", (int)pl->index);
        else
            n += (size_t)snprintf(buf + n, sizeof buf - n, "arena+%zu", pl->offset);
    }
    return buf;
}

const char *tu_copies_str(const loom_ir_plan *p) {
    static char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t c = 0; c < p->n_copies && n < sizeof buf; c++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%%%d->out%d", c ? " " : "",
                              (int)p->copies[c].node, (int)p->copies[c].output);
    return buf;
}

void tu_deinit_both(loom_ir_graph *g, loom_ir_plan *p) {
    loom_ir_plan_deinit(p);
    loom_ir_graph_deinit(g);
}

long tu_dead_pid(void) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return (long)pid;
}
