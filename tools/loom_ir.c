/* loom-ir: inspect IR text files (as LOOM_DUMP writes them): print in canonical form,
 * verify, summarize, export to Graphviz, hash, run pass pipelines and show execution plans. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "passes/passes.h"

enum { EXIT_OK = 0, EXIT_INVALID = 1, EXIT_USAGE = 2 };

static const char usage_text[] =
    "usage: loom-ir <command> FILE\n"
    "\n"
    "Commands:\n"
    "  print FILE    parse and verify FILE, then print it in canonical form\n"
    "  verify FILE   parse and verify FILE; errors are reported as FILE:LINE:COL\n"
    "  stats FILE    node count, ops, graph inputs and outputs, bytes, estimated FLOPs\n"
    "  dot FILE      the graph in Graphviz DOT (pipe into `dot -Tsvg`)\n"
    "  hash FILE     the structural hash the executable cache keys on\n"
    "  opt --passes=P1,P2,... [--print-after-each] FILE\n"
    "                run the passes in order (verifying after each) and print the result;\n"
    "                with --print-after-each, print the graph after every pass instead\n"
    "  plan FILE     run the JIT pipeline (dce, cse, fold, fusion, memory planning) and\n"
    "                print the execution plan: kernels, buffers, copies, peak memory\n"
    "\n"
    "FILE may be '-' for standard input.\n"
    "Exit status: 0 on success, 1 when FILE is invalid or unreadable, 2 on usage errors.\n";

static void write_stdout(const char *chunk, size_t len, void *ud) {
    (void)ud;
    fwrite(chunk, 1, len, stdout);
}

/* Reads and parses path into g, reporting any error on stderr as a compiler would. */
static int load(const char *path, loom_ir_graph *g) {
    const char *shown = strcmp(path, "-") == 0 ? "<stdin>" : path;
    loom_allocator a = loom_allocator_system();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    char *text = NULL;
    size_t len = 0;
    loom_status st = loom_ir_read_file(path, &a, &text, &len, &d);
    if (st == LOOM_OK) {
        st = loom_ir_graph_parse(g, text, len, &d);
        loom_ir_free(&a, text, len + 1);
    }
    if (st == LOOM_OK)
        return EXIT_OK;
    const char *msg = d.msg;
    size_t plen = strlen(path); /* file.c's messages start with "path: " */
    if (strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
        msg += plen + 2;
    if (st == LOOM_STATUS_PARSE_ERROR && d.line > 0)
        fprintf(stderr, "%s:%d:%d: error: %s\n", shown, (int)d.line, (int)d.col, msg);
    else
        fprintf(stderr, "%s: error: %s\n", shown, msg);
    return EXIT_INVALID;
}

static double numel_f64(const loom_ir_node *n) {
    double v = 1;
    for (int32_t i = 0; i < n->rank; i++)
        v *= (double)n->shape[i];
    return v;
}

static double bytes_f64(const loom_ir_node *n) {
    return numel_f64(n) * (double)loom_dtype_size(n->dtype);
}

static void print_stats(const loom_ir_graph *g) {
    char type[LOOM_IR_TYPE_STR_MAX];
    int32_t per_op[LOOM_IR_OP_COUNT_] = {0};
    double flops = 0, in_bytes = 0, out_bytes = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        per_op[g->nodes[i].op]++;
        flops += loom_ir_node_flops(g, &g->nodes[i]);
    }
    printf("nodes: %d\n", (int)g->n_nodes);
    printf("ops:\n");
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++)
        if (per_op[op])
            printf("  %-12s %d\n", loom_ir_op_name((loom_ir_op)op), (int)per_op[op]);
    printf("inputs: %d\n", (int)g->n_graph_inputs);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        in_bytes += bytes_f64(n);
        printf("  input %lld: %%%d %s (%.0f bytes)\n", (long long)n->attrs.index, (int)i,
               loom_ir_format_type(type, sizeof type, n->dtype, n->rank, n->shape),
               bytes_f64(n));
    }
    printf("outputs: %d\n", (int)g->n_outputs);
    for (int32_t o = 0; o < g->n_outputs; o++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o].node];
        out_bytes += bytes_f64(n);
        printf("  output %d: %%%d %s (%.0f bytes)", (int)o, (int)g->outputs[o].node,
               loom_ir_format_type(type, sizeof type, n->dtype, n->rank, n->shape),
               bytes_f64(n));
        if (g->outputs[o].alias >= 0)
            printf(", written into input %d", (int)g->outputs[o].alias);
        printf("\n");
    }
    printf("input bytes: %.0f\n", in_bytes);
    printf("output bytes: %.0f\n", out_bytes);
    printf("flops: %.0f\n", flops);
}

/* `// after cse (changed)` and the graph, after every pass of `opt --print-after-each` */
static void print_after_pass(const char *pass_name, bool changed, const loom_ir_graph *g,
                             void *ud) {
    (void)ud;
    printf("// after %s (%s)\n", pass_name, changed ? "changed" : "unchanged");
    fflush(stdout);
    loom_ir_graph_print(g, write_stdout, NULL);
}

static void print_known_passes(void) {
    int32_t n;
    const loom_pass *const *all = loom_pass_all(&n);
    fprintf(stderr, "known passes:");
    for (int32_t i = 0; i < n; i++)
        fprintf(stderr, "%s %s", i ? "," : "", all[i]->name);
    fprintf(stderr, "\n");
}

/* The shown name of a path, as load() reports it. */
static const char *shown_path(const char *path) {
    return strcmp(path, "-") == 0 ? "<stdin>" : path;
}

/* loom-ir opt --passes=LIST [--print-after-each] FILE */
static int cmd_opt(int argc, char **argv) {
    const char *list = NULL, *path = NULL;
    bool each = false;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "--passes=", 9) == 0) {
            list = argv[i] + 9;
        } else if (strcmp(argv[i], "--print-after-each") == 0) {
            each = true;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "loom-ir: opt: unknown option '%s'\n\n%s", argv[i], usage_text);
            return EXIT_USAGE;
        } else if (path) {
            fprintf(stderr, "loom-ir: opt takes exactly one FILE\n\n%s", usage_text);
            return EXIT_USAGE;
        } else {
            path = argv[i];
        }
    }
    if (!list || !path) {
        fprintf(stderr, "loom-ir: opt needs --passes=LIST and a FILE\n\n%s", usage_text);
        return EXIT_USAGE;
    }
    enum { MAX_PASSES = 64 };
    const loom_pass *passes[MAX_PASSES];
    int32_t n_passes = 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[64];
        const loom_pass *pass = NULL;
        if (len > 0 && len < sizeof name) {
            memcpy(name, p, len);
            name[len] = '\0';
            pass = loom_pass_find(name);
        }
        if (!pass) {
            fprintf(stderr, "loom-ir: opt: unknown pass '%.*s'; ", (int)len, p);
            print_known_passes();
            return EXIT_USAGE;
        }
        if (n_passes == MAX_PASSES) {
            fprintf(stderr, "loom-ir: opt: more than %d passes\n", MAX_PASSES);
            return EXIT_USAGE;
        }
        passes[n_passes++] = pass;
        p = end ? end + 1 : p + len;
    }

    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int rc = load(path, &g);
    if (rc == EXIT_OK) {
        loom_pass_options opts = {.verify_each = true,
                                  .after_pass = each ? print_after_pass : NULL};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_pass_run_pipeline(&g, passes, n_passes, &opts, &d) != LOOM_OK) {
            fprintf(stderr, "%s: error: %s\n", shown_path(path), d.msg);
            rc = EXIT_INVALID;
        } else if (!each) {
            loom_ir_graph_print(&g, write_stdout, NULL);
        }
    }
    loom_ir_graph_deinit(&g);
    return rc;
}

/* loom-ir plan FILE */
static int cmd_plan(const char *path) {
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, &a);
    int rc = load(path, &g);
    if (rc == EXIT_OK) {
        loom_pass_options opts = {.verify_each = true};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_pass_build_plan(&g, &opts, &plan, &d) != LOOM_OK) {
            fprintf(stderr, "%s: error: %s\n", shown_path(path), d.msg);
            rc = EXIT_INVALID;
        } else {
            loom_ir_plan_print(&plan, &g, write_stdout, NULL);
        }
    }
    loom_ir_plan_deinit(&plan);
    loom_ir_graph_deinit(&g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage_text, stdout);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "opt") == 0 || strcmp(cmd, "plan") == 0) {
        int rc;
        if (strcmp(cmd, "opt") == 0) {
            rc = cmd_opt(argc, argv);
        } else if (argc != 3) {
            fprintf(stderr, "loom-ir: plan takes exactly one FILE\n\n%s", usage_text);
            return EXIT_USAGE;
        } else {
            rc = cmd_plan(argv[2]);
        }
        if (rc == EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
            fprintf(stderr, "loom-ir: error: cannot write the output\n");
            rc = EXIT_INVALID;
        }
        return rc;
    }
    static const char *const commands[] = {"print", "verify", "stats", "dot", "hash"};
    bool known = false;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        known = known || strcmp(cmd, commands[i]) == 0;
    if (!known) {
        fprintf(stderr, "loom-ir: unknown command '%s'\n\n%s", cmd, usage_text);
        return EXIT_USAGE;
    }
    if (argc != 3) {
        fprintf(stderr, "loom-ir: %s takes exactly one FILE\n\n%s", cmd, usage_text);
        return EXIT_USAGE;
    }
    const char *path = argv[2];

    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int rc = load(path, &g);
    if (rc == EXIT_OK) {
        if (strcmp(cmd, "print") == 0)
            loom_ir_graph_print(&g, write_stdout, NULL);
        else if (strcmp(cmd, "verify") == 0)
            printf("%s: ok: %d nodes, %d inputs, %d outputs\n",
                   strcmp(path, "-") == 0 ? "<stdin>" : path, (int)g.n_nodes,
                   (int)g.n_graph_inputs, (int)g.n_outputs);
        else if (strcmp(cmd, "stats") == 0)
            print_stats(&g);
        else if (strcmp(cmd, "dot") == 0)
            loom_ir_graph_dot(&g, write_stdout, NULL);
        else
            printf("%016" PRIx64 "\n", loom_ir_graph_hash(&g));
        if (fflush(stdout) != 0 || ferror(stdout)) {
            fprintf(stderr, "loom-ir: error: cannot write the output\n");
            rc = EXIT_INVALID;
        }
    }
    loom_ir_graph_deinit(&g);
    return rc;
}
