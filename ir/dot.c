/* Graphviz export of IR graphs: a box per node (id, op, type, source location), an edge
 * per operand, and a double circle per graph output naming the input it is written into. */
#include <stdio.h>
#include <string.h>

#include "ir.h"

/* Text inside a double-quoted DOT string: quotes and backslashes escaped (a lone backslash
 * would start a DOT escape such as \n), control bytes dropped. */
static void put_escaped(loom_ir_writer *o, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            loom_ir_writer_put(o, e, 2);
        } else if (*c >= 0x20 && *c != 0x7f) {
            loom_ir_writer_put(o, (const char *)c, 1);
        }
    }
}

loom_status loom_ir_graph_dot(const loom_ir_graph *g, loom_ir_write_fn write, void *ud) {
    if (!g || !write)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_ir_writer o = {.write = write, .ud = ud};
    loom_ir_writer_printf(&o, "digraph loom {\n"
             "  rankdir=TB;\n"
             "  node [shape=box, fontname=\"monospace\"];\n");
    char type[LOOM_IR_TYPE_STR_MAX];
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        int32_t rank = n->rank < 0 ? 0 : n->rank > LOOM_MAX_RANK ? LOOM_MAX_RANK : n->rank;
        loom_ir_writer_printf(&o, "  n%d [label=\"%%%d %s", (int)i, (int)i, loom_ir_op_name(n->op));
        if (n->op == LOOM_IR_OP_INPUT)
            loom_ir_writer_printf(&o, " %lld", (long long)n->attrs.index);
        loom_ir_writer_put(&o, "\\n", 2);
        put_escaped(&o, loom_ir_format_type(type, sizeof type, n->dtype, rank, n->shape));
        if ((unsigned)n->op < LOOM_IR_OP_COUNT_ &&
            loom_ir_op_traits(n->op)->window) { /* its window, no quotes */
            loom_ir_writer_put(&o, "\\n", 2);
            loom_ir_write_attrs(&o, n, true);
        }
        if (n->loc.scope) {
            loom_ir_writer_put(&o, "\\n", 2);
            put_escaped(&o, n->loc.scope);
            if (n->loc.backward)
                loom_ir_writer_puts(&o, ".grad");
        }
        if (n->loc.file) {
            loom_ir_writer_put(&o, "\\n", 2);
            put_escaped(&o, n->loc.file);
            loom_ir_writer_printf(&o, ":%d", (int)n->loc.line);
        }
        loom_ir_writer_put(&o, "\"];\n", 4);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        /* Operand order matters for sub, div, matmul, select: label it when there are
         * several. */
        for (int32_t k = 0; k < n->n_inputs; k++) {
            if (n->n_inputs > 1)
                loom_ir_writer_printf(&o, "  n%d -> n%d [label=\"%d\"];\n", (int)n->inputs[k], (int)i, (int)k);
            else
                loom_ir_writer_printf(&o, "  n%d -> n%d;\n", (int)n->inputs[k], (int)i);
        }
    }
    for (int32_t r = 0; r < g->n_outputs; r++) {
        const loom_ir_output *out = &g->outputs[r];
        loom_ir_writer_printf(&o, "  out%d [shape=doublecircle, label=\"return %d", (int)r, (int)r);
        if (out->alias >= 0)
            loom_ir_writer_printf(&o, "\\nalias input %d", (int)out->alias);
        loom_ir_writer_put(&o, "\"];\n", 4);
        loom_ir_writer_printf(&o, "  n%d -> out%d;\n", (int)out->node, (int)r);
    }
    loom_ir_writer_put(&o, "}\n", 2);
    loom_ir_writer_flush(&o);
    return LOOM_OK;
}
