/* loom-ir: inspect IR text files (as LOOM_DUMP writes them): print in canonical form,
 * verify, summarize, export to Graphviz and hash. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

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

/* Estimated floating-point (or integer) operations of one node: 2*M*N*K per matmul batch,
 * one per element for elementwise ops, one per input element for reductions, none for
 * sources and data movement. */
static double node_flops(const loom_ir_graph *g, const loom_ir_node *n) {
    switch (loom_ir_op_table[n->op].kind) {
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_CAST: return numel_f64(n);
    case LOOM_IR_KIND_REDUCTION: return numel_f64(&g->nodes[n->inputs[0]]);
    case LOOM_IR_KIND_CONTRACTION: {
        const loom_ir_node *a = &g->nodes[n->inputs[0]];
        return 2.0 * numel_f64(n) * (double)a->shape[a->rank - 1];
    }
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_COUNT_: break;
    }
    return 0;
}

static void print_stats(const loom_ir_graph *g) {
    char type[LOOM_IR_TYPE_STR_MAX];
    int32_t per_op[LOOM_IR_OP_COUNT_] = {0};
    double flops = 0, in_bytes = 0, out_bytes = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        per_op[g->nodes[i].op]++;
        flops += node_flops(g, &g->nodes[i]);
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
