/* The IR text printer: one node a line in the MLIR-like format documented above
 * loom_ir_graph_print in ir.h, written through the caller's chunked callback. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir.h"

/* Output is staged in a fixed local buffer and handed to the callback in chunks, so a
 * print allocates nothing and the callback sees few, large writes. */
typedef struct printer {
    loom_ir_write_fn write;
    void *ud;
    size_t len;
    char buf[4096];
} printer;

static void flush(printer *p) {
    if (p->len > 0)
        p->write(p->buf, p->len, p->ud);
    p->len = 0;
}

static void put(printer *p, const char *s, size_t len) {
    while (len > 0) {
        if (p->len == sizeof p->buf)
            flush(p);
        size_t n = sizeof p->buf - p->len;
        if (n > len)
            n = len;
        memcpy(p->buf + p->len, s, n);
        p->len += n;
        s += n;
        len -= n;
    }
}

static void puts_(printer *p, const char *s) { put(p, s, strlen(s)); }

__attribute__((format(printf, 2, 3)))
static void putf(printer *p, const char *fmt, ...) {
    char tmp[256]; /* every caller formats a few numbers: far below this */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(p, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* %.17g round-trips every double through strtod; inf and nan are spelled out so the text
 * does not depend on the C library's spelling. */
static void put_double(printer *p, double v) {
    if (isnan(v))
        puts_(p, signbit(v) ? "-nan" : "nan");
    else if (isinf(v))
        puts_(p, v < 0 ? "-inf" : "inf");
    else
        putf(p, "%.17g", v);
}

/* A quoted string: quotes and backslashes escaped, control bytes as \xHH so that any file
 * name survives a round trip through the parser. */
static void put_quoted(printer *p, const char *s) {
    put(p, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            put(p, e, 2);
        } else if (*c < 0x20 || *c == 0x7f) {
            putf(p, "\\x%02x", (unsigned)*c);
        } else {
            put(p, (const char *)c, 1);
        }
    }
    put(p, "\"", 1);
}

static void put_attrs(printer *p, const loom_ir_node *n) {
    switch (loom_ir_op_table[n->op].attrs) {
    case LOOM_IR_ATTRS_NONE: return;
    case LOOM_IR_ATTRS_INDEX: putf(p, " {index = %lld}", (long long)n->attrs.index); return;
    case LOOM_IR_ATTRS_VALUE:
        puts_(p, " {value = ");
        put_double(p, n->attrs.value);
        puts_(p, "}");
        return;
    case LOOM_IR_ATTRS_PERM:
        puts_(p, " {perm = [");
        for (int32_t i = 0; i < n->rank && i < LOOM_MAX_RANK; i++)
            putf(p, i ? ", %d" : "%d", (int)n->attrs.perm[i]);
        puts_(p, "]}");
        return;
    case LOOM_IR_ATTRS_AXES: {
        puts_(p, " {axes = [");
        bool first = true;
        for (int32_t i = 0; i < 32; i++) {
            if (n->attrs.axes & (1u << i)) {
                putf(p, first ? "%d" : ", %d", (int)i);
                first = false;
            }
        }
        putf(p, "], keepdim = %s}", n->attrs.keepdim ? "true" : "false");
        return;
    }
    case LOOM_IR_ATTRS_COUNT_: return;
    }
}

static void put_node(printer *p, int32_t id, const loom_ir_node *n) {
    bool known = (unsigned)n->op < LOOM_IR_OP_COUNT_;
    putf(p, "  %%%d = %s", (int)id, loom_ir_op_name(n->op));
    for (int32_t k = 0; k < n->n_inputs; k++)
        putf(p, k ? ", %%%d" : " %%%d", (int)n->inputs[k]);
    if (known)
        put_attrs(p, n);
    char type[LOOM_IR_TYPE_STR_MAX];
    int32_t rank = n->rank < 0 ? 0 : n->rank > LOOM_MAX_RANK ? LOOM_MAX_RANK : n->rank;
    puts_(p, " : ");
    puts_(p, loom_ir_format_type(type, sizeof type, n->dtype, rank, n->shape));
    if (n->loc.file) {
        puts_(p, " loc(");
        put_quoted(p, n->loc.file);
        putf(p, ":%d)", (int)n->loc.line);
    }
    puts_(p, "\n");
}

loom_status loom_ir_graph_print(const loom_ir_graph *g, loom_ir_write_fn write, void *ud) {
    if (!g || !write)
        return LOOM_STATUS_INVALID_ARGUMENT;
    printer p = {.write = write, .ud = ud};
    puts_(&p, "loom.graph {\n");
    for (int32_t i = 0; i < g->n_nodes; i++)
        put_node(&p, i, &g->nodes[i]);
    puts_(&p, "  return");
    for (int32_t o = 0; o < g->n_outputs; o++) {
        putf(&p, o ? ", %%%d" : " %%%d", (int)g->outputs[o].node);
        if (g->outputs[o].alias >= 0)
            putf(&p, " {alias = %d}", (int)g->outputs[o].alias);
    }
    puts_(&p, "\n}\n");
    flush(&p);
    return LOOM_OK;
}
