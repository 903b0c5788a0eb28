/* libFuzzer target for the IR text parser: any bytes must parse or fail cleanly, and any
 * graph that parses must print, re-parse to an equal graph, and print identically. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fuzzer's invariants are Loom's own: a violation is a bug, so stop loudly. */
static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_ir_parse: invariant violated: %s\n", what);
        abort();
    }
}

static void print_into(const loom_ir_graph *g, loom_ir_sbuf *sb) {
    check(loom_ir_graph_print(g, loom_ir_sbuf_write, sb) == LOOM_OK, "print failed");
    check(!sb->oom && sb->data != NULL, "print ran out of memory");
}

static void check_round_trip(const loom_ir_graph *g, const loom_allocator *a) {
    loom_ir_sbuf t1, t2, dot;
    loom_ir_sbuf_init(&t1, a);
    loom_ir_sbuf_init(&t2, a);
    loom_ir_sbuf_init(&dot, a);
    print_into(g, &t1);

    loom_ir_graph h;
    loom_ir_graph_init(&h, a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_parse(&h, t1.data, t1.len, &d) != LOOM_OK) {
        fprintf(stderr, "re-parse failed at %d:%d: %s\n%s", (int)d.line, (int)d.col, d.msg,
                t1.data);
        check(false, "printed text does not parse");
    }
    check(loom_ir_graph_equal(g, &h), "parse(print(g)) differs from g");
    check(loom_ir_graph_hash(g) == loom_ir_graph_hash(&h), "parse(print(g)) hashes differently");
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_loc *x = &g->nodes[i].loc, *y = &h.nodes[i].loc;
        check((x->file == NULL) == (y->file == NULL) && x->line == y->line &&
                  (!x->file || strcmp(x->file, y->file) == 0),
              "a location changed");
    }
    print_into(&h, &t2);
    check(t1.len == t2.len && memcmp(t1.data, t2.data, t1.len) == 0, "print is not stable");

    /* Not checked beyond not failing: exercises the DOT writer on every valid graph. */
    check(loom_ir_graph_dot(g, loom_ir_sbuf_write, &dot) == LOOM_OK && !dot.oom, "dot failed");

    loom_ir_graph_deinit(&h);
    loom_ir_sbuf_deinit(&dot);
    loom_ir_sbuf_deinit(&t2);
    loom_ir_sbuf_deinit(&t1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_ir_graph_parse(&g, (const char *)data, size, &d);
    if (st == LOOM_OK) {
        check(d.code == LOOM_OK, "success with an error recorded");
        check_round_trip(&g, &a);
    } else {
        check(st == LOOM_STATUS_PARSE_ERROR || st == LOOM_STATUS_VERIFY_FAILED,
              "unexpected status");
        check(d.code == st && d.msg[0] != '\0', "error without a message");
        check(st != LOOM_STATUS_PARSE_ERROR || (d.line >= 1 && d.col >= 1),
              "parse error without a position");
        check(g.n_nodes == 0 && g.n_outputs == 0, "graph not emptied after an error");
    }
    loom_ir_graph_deinit(&g);
    return 0;
}
