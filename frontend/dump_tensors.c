/* LOOM_DUMP_TENSORS=<dir>: the value of each selected node of each selected step, written by
 * loom_mark_step as <dir>/step<N>.safetensors, one tensor per node named by its scope, op and
 * node, "layer1.0.conv1.conv2d.%412" ("layer1.0.conv1.grad.conv2d_grad_input.%530" for a
 * backward node; outside every scope "matmul.%7", or "grad.mul.%40" for a backward one),
 * with the dtype it had. Selected by LOOM_DUMP_TENSORS_SCOPES (globs over the scope as
 * printed, "layer1.*,fc*.grad"), LOOM_DUMP_TENSORS_OPS ("conv2d,matmul"),
 * LOOM_DUMP_TENSORS_STEPS ("0,3,10-12") and LOOM_DUMP_TENSORS_PASS (forward, backward or all),
 * each unset: everything; read at each mark_step. The selected nodes become outputs of the
 * step, so a dumped step compiles its own program (its kernels can differ from the undumped
 * step's: values stored between them). */
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend.h"
#include "loom/safetensors.h"

/* Whether s is one of list's comma-separated items (globs: fnmatch patterns). */
static bool listed(const char *list, const char *s, bool glob) {
    char item[256];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof item) {
            memcpy(item, p, n);
            item[n] = '\0';
            if (glob ? fnmatch(item, s, 0) == 0 : strcmp(item, s) == 0)
                return true;
        }
        p += n + (p[n] == ',');
    }
    return false;
}

/* Whether step is in "0,3,10-12". */
static bool step_listed(const char *list, int64_t step) {
    for (const char *p = list; *p;) {
        char *end;
        long long a = strtoll(p, &end, 10), b = a;
        if (end != p && *end == '-')
            b = strtoll(end + 1, &end, 10);
        if (end != p && step >= a && step <= b)
            return true;
        p += strcspn(p, ",");
        p += *p == ',';
    }
    return false;
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

void loom_fe_tensor_dump_begin(loom_context *ctx, loom_fe_tensor_dump *td) {
    *td = (loom_fe_tensor_dump){0};
    const char *dir = env("LOOM_DUMP_TENSORS"), *steps = env("LOOM_DUMP_TENSORS_STEPS");
    if (!dir || (steps && !step_listed(steps, ctx->step)))
        return;
    const char *scopes = env("LOOM_DUMP_TENSORS_SCOPES"), *ops = env("LOOM_DUMP_TENSORS_OPS");
    const char *pass = env("LOOM_DUMP_TENSORS_PASS");
    bool fwd = !pass || strcmp(pass, "backward") != 0, bwd = !pass || strcmp(pass, "forward") != 0;
    if (pass && strcmp(pass, "forward") && strcmp(pass, "backward") && strcmp(pass, "all")) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "mark_step",
                      "LOOM_DUMP_TENSORS_PASS=%s: give forward, backward or all", pass);
        return;
    }
    const loom_ir_graph *g = &ctx->trace;
    int32_t n_nodes = g->n_nodes; /* the results made below add no nodes */
    for (int32_t i = 0; i < n_nodes; i++) {
        const loom_ir_node *nd = &g->nodes[i];
        if (nd->op == LOOM_IR_OP_CONSTANT || (nd->loc.backward ? !bwd : !fwd))
            continue;
        char scope[LOOM_SCOPE_MAX_LEN + 8];
        snprintf(scope, sizeof scope, "%s%s", nd->loc.scope ? nd->loc.scope : "",
                 !nd->loc.backward ? ""
                 : nd->loc.scope   ? ".grad"
                                   : "grad"); /* a gradient node outside every scope */
        if ((scopes && !listed(scopes, scope, true)) ||
            (ops && !listed(ops, loom_ir_op_name(nd->op), false)))
            continue;
        if (!loom_ir_grow(&ctx->alloc, (void **)&td->items, &td->cap, td->n + 1,
                          sizeof *td->items)) {
            loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step", "out of memory");
            return;
        }
        int len = snprintf(NULL, 0, "%s%s%s.%%%d", scope, scope[0] ? "." : "",
                           loom_ir_op_name(nd->op), (int)i);
        char *name = loom_ir_alloc(&ctx->alloc, (size_t)len + 1);
        loom_tensor *t =
            name ? loom_fe_result(ctx, i, nd->loc.file, nd->loc.line, "mark_step") : NULL;
        if (!t) {
            loom_ir_free(&ctx->alloc, name, name ? (size_t)len + 1 : 0);
            if (!name)
                loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "mark_step",
                              "out of memory");
            return;
        }
        snprintf(name, (size_t)len + 1, "%s%s%s.%%%d", scope, scope[0] ? "." : "",
                 loom_ir_op_name(nd->op), (int)i);
        loom_tensor_retain(t); /* a root of the step until written */
        td->items[td->n++] = (loom_named_tensor){name, t};
    }
    td->dir = dir;
    td->step = ctx->step;
}

void loom_fe_tensor_dump_end(loom_context *ctx, loom_fe_tensor_dump *td) {
    if (td->n > 0 && td->dir && ctx->err == LOOM_OK) {
        char path[4096];
        if (mkdir(td->dir, 0777) != 0 && errno != EEXIST)
            loom_fe_error(ctx, LOOM_STATUS_IO_ERROR, NULL, 0, "mark_step",
                          "LOOM_DUMP_TENSORS: cannot create %s: %s", td->dir, strerror(errno));
        else if (snprintf(path, sizeof path, "%s/step%" PRId64 ".safetensors", td->dir, td->step) >=
                 (int)sizeof path)
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "mark_step",
                          "LOOM_DUMP_TENSORS: the directory's name is too long");
        else
            loom_safetensors_save(ctx, path, td->n, td->items);
    }
    for (int32_t k = 0; k < td->n; k++) {
        loom_tensor_release(td->items[k].tensor);
        loom_ir_free(&ctx->alloc, (char *)td->items[k].name, strlen(td->items[k].name) + 1);
    }
    loom_ir_free(&ctx->alloc, td->items, (size_t)td->cap * sizeof *td->items);
    *td = (loom_fe_tensor_dump){0};
}
