/* Graphviz export of IR graphs: a box per node (id, op, type, source location), an edge
 * per operand, and a double circle per graph output naming the input it is written into. */
#include <stdio.h>
#include <string.h>

#include "ir.h"

/* Output goes through a fixed local buffer, flushed in chunks, as in print.c. */
typedef struct dot_out {
    loom_ir_write_fn write;
    void *ud;
    size_t len;
    char buf[4096];
} dot_out;

static void flush(dot_out *o) {
    if (o->len > 0)
        o->write(o->buf, o->len, o->ud);
    o->len = 0;
}

static void put(dot_out *o, const char *s, size_t len) {
    while (len > 0) {
        if (o->len == sizeof o->buf)
            flush(o);
        size_t n = sizeof o->buf - o->len;
        if (n > len)
            n = len;
        memcpy(o->buf + o->len, s, n);
        o->len += n;
        s += n;
        len -= n;
    }
}

__attribute__((format(printf, 2, 3)))
static void putf(dot_out *o, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Text inside a double-quoted DOT string: quotes and backslashes escaped (a lone backslash
 * would start a DOT escape such as \n), control bytes dropped. */
static void put_escaped(dot_out *o, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            put(o, e, 2);
        } else if (*c >= 0x20 && *c != 0x7f) {
            put(o, (const char *)c, 1);
        }
    }
}

loom_status loom_ir_graph_dot(const loom_ir_graph *g, loom_ir_write_fn write, void *ud) {
    if (!g || !write)
        return LOOM_STATUS_INVALID_ARGUMENT;
    dot_out o = {.write = write, .ud = ud};
    putf(&o, "digraph loom {\n"
             "  rankdir=TB;\n"
             "  node [shape=box, fontname=\"monospace\"];\n");
    char type[LOOM_IR_TYPE_STR_MAX];
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        int32_t rank = n->rank < 0 ? 0 : n->rank > LOOM_MAX_RANK ? LOOM_MAX_RANK : n->rank;
        putf(&o, "  n%d [label=\"%%%d %s", (int)i, (int)i, loom_ir_op_name(n->op));
        if (n->op == LOOM_IR_OP_INPUT)
            putf(&o, " %lld", (long long)n->attrs.index);
        put(&o, "\\n", 2);
        put_escaped(&o, loom_ir_format_type(type, sizeof type, n->dtype, rank, n->shape));
        if (n->loc.file) {
            put(&o, "\\n", 2);
            put_escaped(&o, n->loc.file);
            putf(&o, ":%d", (int)n->loc.line);
        }
        put(&o, "\"];\n", 4);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        /* Operand order matters for sub, div, matmul, select: label it when there are
         * several. */
        for (int32_t k = 0; k < n->n_inputs; k++) {
            if (n->n_inputs > 1)
                putf(&o, "  n%d -> n%d [label=\"%d\"];\n", (int)n->inputs[k], (int)i, (int)k);
            else
                putf(&o, "  n%d -> n%d;\n", (int)n->inputs[k], (int)i);
        }
    }
    for (int32_t r = 0; r < g->n_outputs; r++) {
        const loom_ir_output *out = &g->outputs[r];
        putf(&o, "  out%d [shape=doublecircle, label=\"return %d", (int)r, (int)r);
        if (out->alias >= 0)
            putf(&o, "\\nalias input %d", (int)out->alias);
        put(&o, "\"];\n", 4);
        putf(&o, "  n%d -> out%d;\n", (int)out->node, (int)r);
    }
    put(&o, "}\n", 2);
    flush(&o);
    return LOOM_OK;
}
