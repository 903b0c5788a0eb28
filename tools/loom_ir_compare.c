/* loom-ir compare: two tensor dumps (LOOM_DUMP_TENSORS files, or any safetensors files with
 * the same names), tensor by tensor, under msProbe's pass rules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/safetensors.h"
#include "runtime/runtime.h"
#include "loom_ir_exec.h"

typedef struct row {
    const char *name;
    char dtypes[32];
    int64_t count;
    double cosine, max_abs, max_rel, rmse;
    const char *problem; /* NULL: compared; else why not ("only in A", "shapes differ") */
    bool fail;
} row;

/* The measures of a and b (n elements of dtypes da, db), as doubles. An all-zero pair has
 * cosine 1; one all-zero side against a nonzero one, 0. */
static void measure(row *r, const void *a, loom_dtype da, const void *b, loom_dtype db, int64_t n) {
    double dot = 0, na = 0, nb = 0, sq = 0, max_abs = 0, max_rel = 0;
    bool nonfinite = false;
    for (int64_t i = 0; i < n; i++) {
        double x = loom_ir_load_f64(a, da, i), y = loom_ir_load_f64(b, db, i);
        if (!isfinite(x) || !isfinite(y)) {
            /* equal infinities (or both NaN) agree; anything else fails */
            if (!(x == y || (isnan(x) && isnan(y))))
                nonfinite = true;
            continue;
        }
        double d = fabs(x - y);
        dot += x * y;
        na += x * x;
        nb += y * y;
        sq += d * d;
        max_abs = d > max_abs ? d : max_abs;
        double rel = d / fmax(fabs(x), 1e-12);
        max_rel = d > 0 && rel > max_rel ? rel : max_rel;
    }
    r->count = n;
    r->cosine = na == 0 && nb == 0 ? 1.0 : na == 0 || nb == 0 ? 0.0 : dot / sqrt(na * nb);
    r->max_abs = nonfinite ? INFINITY : max_abs;
    r->max_rel = nonfinite ? INFINITY : max_rel;
    r->rmse = n ? sqrt(sq / (double)n) : 0;
}

bool loom_ir_compare_rules_parse(const char *s, loom_ir_compare_rules *r, char *err,
                                 size_t err_size) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        char *end = NULL;
        double v = eq ? strtod(eq + 1, &end) : 0;
        if (!eq || end == eq + 1 || *end || !isfinite(v)) {
            snprintf(err, err_size, "'%s' is not KEY=VALUE with a finite VALUE", kv);
            return false;
        }
        *eq = '\0';
        if (strcmp(kv, "cos") == 0)
            r->cos = v;
        else if (strcmp(kv, "abs") == 0)
            r->abs = v;
        else if (strcmp(kv, "cos_fail") == 0)
            r->cos_fail = v;
        else if (strcmp(kv, "abs_fail") == 0)
            r->abs_fail = v;
        else {
            snprintf(err, err_size, "unknown rule '%s' (cos, abs, cos_fail, abs_fail)", kv);
            return false;
        }
    }
    return true;
}

static bool fails(const row *r, const loom_ir_compare_rules *ru) {
    if (r->problem)
        return true;
    return (r->cosine < ru->cos && r->max_abs > ru->abs) || r->cosine < ru->cos_fail ||
           r->max_abs > ru->abs_fail || isnan(r->cosine);
}

static void write_file(const char *chunk, size_t len, void *ud) {
    fwrite(chunk, 1, len, ud);
}

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

static void json_num(loom_ir_writer *w, double v) {
    if (isfinite(v))
        loom_ir_writer_printf(w, "%.9g", v);
    else
        loom_ir_writer_puts(w, "null"); /* JSON has no inf or NaN */
}

static void write_json(loom_ir_writer *w, const row *rows, int32_t n, int32_t first, int32_t n_fail,
                       const loom_ir_compare_rules *ru) {
    loom_ir_writer_printf(w, "{\"rules\":{\"cos\":%g,\"abs\":%g,\"cos_fail\":%g,\"abs_fail\":%g},",
                          ru->cos, ru->abs, ru->cos_fail, ru->abs_fail);
    loom_ir_writer_printf(w, "\"compared\":%d,\"failed\":%d,\"first_failure\":", (int)n,
                          (int)n_fail);
    if (first >= 0)
        loom_rt_json_string(w, rows[first].name);
    else
        loom_ir_writer_puts(w, "null");
    loom_ir_writer_puts(w, ",\"tensors\":[");
    for (int32_t i = 0; i < n; i++) {
        const row *r = &rows[i];
        loom_ir_writer_puts(w, i ? ",{\"name\":" : "{\"name\":");
        loom_rt_json_string(w, r->name);
        loom_ir_writer_printf(w, ",\"pass\":%s,\"dtypes\":", r->fail ? "false" : "true");
        loom_rt_json_string(w, r->dtypes);
        if (r->problem) {
            loom_ir_writer_puts(w, ",\"problem\":");
            loom_rt_json_string(w, r->problem);
        } else {
            loom_ir_writer_printf(w, ",\"count\":%lld,\"cosine\":", (long long)r->count);
            json_num(w, r->cosine);
            loom_ir_writer_puts(w, ",\"max_abs\":");
            json_num(w, r->max_abs);
            loom_ir_writer_puts(w, ",\"max_rel\":");
            json_num(w, r->max_rel);
            loom_ir_writer_puts(w, ",\"rmse\":");
            json_num(w, r->rmse);
        }
        loom_ir_writer_puts(w, "}");
    }
    loom_ir_writer_puts(w, "]}\n");
}

/* A self-contained page: the table, failing rows highlighted, sortable by clicking a head. */
static void write_html(FILE *f, const char *a, const char *b, const row *rows, int32_t n,
                       int32_t first, int32_t n_fail) {
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>loom-ir compare</title>\n"
          "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 6px;font-family:monospace}"
          "th{cursor:pointer;background:#eee}tr.fail{background:#fdd}tr.first{background:#f99}"
          "td.n{text-align:right}</style></head><body>\n<h1>loom-ir compare</h1>\n<p>A: ",
          f);
    html_text(f, a);
    fputs("<br>B: ", f);
    html_text(f, b);
    fprintf(f, "<br>%d tensors, %d failing", (int)n, (int)n_fail);
    if (first >= 0) {
        fputs("; the first in graph order: <b>", f);
        html_text(f, rows[first].name);
        fputs("</b>", f);
    }
    fputs("</p>\n<table id=\"t\"><thead><tr><th>#</th><th>tensor</th><th>dtypes</th>"
          "<th>count</th><th>cosine</th><th>max abs</th><th>max rel</th><th>RMSE</th>"
          "<th>result</th></tr></thead><tbody>\n",
          f);
    for (int32_t i = 0; i < n; i++) {
        const row *r = &rows[i];
        fprintf(f, "<tr class=\"%s\"><td class=\"n\">%d</td><td>",
                i == first ? "fail first"
                : r->fail  ? "fail"
                           : "",
                (int)i);
        html_text(f, r->name);
        fprintf(f, "</td><td>%s</td>", r->dtypes);
        if (r->problem)
            fprintf(f, "<td colspan=\"5\">%s</td>", r->problem);
        else
            fprintf(f,
                    "<td class=\"n\">%lld</td><td class=\"n\">%.6f</td><td class=\"n\">%.3e</td>"
                    "<td class=\"n\">%.3e</td><td class=\"n\">%.3e</td>",
                    (long long)r->count, r->cosine, r->max_abs, r->max_rel, r->rmse);
        fprintf(f, "<td>%s</td></tr>\n", r->fail ? "FAIL" : "pass");
    }
    fputs("</tbody></table>\n<script>\n"
          "document.querySelectorAll('#t th').forEach(function(th,c){var up=true;"
          "th.onclick=function(){var tb=document.querySelector('#t tbody');"
          "var rs=Array.from(tb.rows);rs.sort(function(x,y){"
          "var a=x.cells[c]?x.cells[c].textContent:'',b=y.cells[c]?y.cells[c].textContent:'';"
          "var p=parseFloat(a),q=parseFloat(b);"
          "var d=(!isNaN(p)&&!isNaN(q))?p-q:a.localeCompare(b);return up?d:-d;});"
          "up=!up;rs.forEach(function(r){tb.appendChild(r);});};});\n"
          "</script></body></html>\n",
          f);
}

/* A tensor of a file: its index, node id (the "%N" a dump's name ends with; -1 without one)
 * and matching key: the name without "%N" and the occurrence of that name in graph order
 * ("fc1.matmul#0"), so that dumps of graphs whose ids differ (autocast on and off, a model
 * edited elsewhere) still pair the nodes of each scope and op. */
typedef struct entry {
    int32_t index;
    long node;
    const char *name;
    char key[320];
} entry;

static int by_node(const void *x, const void *y) {
    const entry *a = x, *b = y;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    return a->index - b->index;
}

/* The file's tensors in graph order (by node id; names without one after, in file order),
 * keyed; NULL when out of memory. */
static entry *entries(const loom_safetensors *f, int32_t n) {
    entry *e = calloc((size_t)n + 1, sizeof *e);
    if (!e)
        return NULL;
    for (int32_t i = 0; i < n; i++) {
        const char *name;
        loom_safetensors_tensor(f, i, &name, NULL, NULL, NULL, NULL, NULL);
        e[i].index = i;
        e[i].name = name;
        const char *pct = strrchr(name, '%');
        char *end = NULL;
        e[i].node = pct ? strtol(pct + 1, &end, 10) : -1;
        if (!pct || end == pct + 1 || *end || e[i].node < 0) {
            e[i].node = 0x7fffffffL;
            pct = name + strlen(name);
        }
        snprintf(e[i].key, sizeof e[i].key, "%.*s", (int)(pct - name), name);
    }
    qsort(e, (size_t)n, sizeof *e, by_node);
    for (int32_t i = 0; i < n; i++) { /* the occurrence of each base name, in graph order */
        size_t len = strlen(e[i].key);
        int32_t k = 0;
        for (int32_t j = 0; j < i; j++)
            k += strncmp(e[j].key, e[i].key, len) == 0 && e[j].key[len] == '#';
        snprintf(e[i].key + len, sizeof e[i].key - len, "#%d", (int)k);
    }
    return e;
}

static int32_t find_key(const entry *e, int32_t n, const char *key) {
    for (int32_t i = 0; i < n; i++)
        if (strcmp(e[i].key, key) == 0)
            return i;
    return -1;
}

int loom_ir_cmd_compare(const char *path_a, const char *path_b, const loom_ir_compare_rules *ru,
                        bool json, const char *html) {
    loom_safetensors *fa = NULL, *fb = NULL;
    char err[512];
    if (loom_safetensors_open(path_a, &fa, err, sizeof err) != LOOM_OK ||
        loom_safetensors_open(path_b, &fb, err, sizeof err) != LOOM_OK) {
        fprintf(stderr, "loom-ir: compare: %s\n", err);
        loom_safetensors_close(fa);
        return 2;
    }
    int32_t na = loom_safetensors_count(fa), nb = loom_safetensors_count(fb);
    row *rows = calloc((size_t)(na + nb) + 1, sizeof *rows);
    if (!rows) {
        fprintf(stderr, "loom-ir: compare: out of memory\n");
        loom_safetensors_close(fa);
        loom_safetensors_close(fb);
        return 2;
    }
    entry *ea = entries(fa, na), *eb = entries(fb, nb);
    int32_t n = 0;
    /* A's graph order, then what only B has */
    for (int32_t i = 0; ea && eb && i < na; i++) {
        row *r = &rows[n++];
        loom_dtype da, db;
        int32_t ra, rb;
        int64_t sa[LOOM_MAX_RANK], sb[LOOM_MAX_RANK];
        const void *xa, *xb;
        loom_safetensors_tensor(fa, ea[i].index, NULL, &da, &ra, sa, &xa, NULL);
        r->name = ea[i].name;
        int32_t j = find_key(eb, nb, ea[i].key);
        if (j < 0) {
            snprintf(r->dtypes, sizeof r->dtypes, "%s / -", loom_dtype_name(da));
            r->problem = "only in A";
        } else {
            loom_safetensors_tensor(fb, eb[j].index, NULL, &db, &rb, sb, &xb, NULL);
            snprintf(r->dtypes, sizeof r->dtypes, "%s / %s", loom_dtype_name(da),
                     loom_dtype_name(db));
            int64_t count = 1;
            bool same = ra == rb;
            for (int32_t k = 0; same && k < ra; k++) {
                same = sa[k] == sb[k];
                count *= sa[k];
            }
            if (!same)
                r->problem = "the shapes differ";
            else
                measure(r, xa, da, xb, db, count);
        }
    }
    for (int32_t j = 0; ea && eb && j < nb; j++) {
        if (find_key(ea, na, eb[j].key) < 0) {
            loom_dtype db;
            loom_safetensors_tensor(fb, eb[j].index, NULL, &db, NULL, NULL, NULL, NULL);
            row *r = &rows[n++];
            r->name = eb[j].name;
            snprintf(r->dtypes, sizeof r->dtypes, "- / %s", loom_dtype_name(db));
            r->problem = "only in B";
        }
    }
    if (!ea || !eb) {
        fprintf(stderr, "loom-ir: compare: out of memory\n");
        free(ea);
        free(eb);
        free(rows);
        loom_safetensors_close(fa);
        loom_safetensors_close(fb);
        return 2;
    }
    int32_t first = -1, n_fail = 0;
    for (int32_t i = 0; i < n; i++) {
        rows[i].fail = fails(&rows[i], ru);
        n_fail += rows[i].fail;
        if (rows[i].fail && first < 0)
            first = i;
    }
    int rc = n_fail ? 1 : 0;
    if (json) {
        loom_ir_writer w = {.write = write_file, .ud = stdout};
        write_json(&w, rows, n, first, n_fail, ru);
        loom_ir_writer_flush(&w);
    } else {
        printf("rules: fail if cosine < %g and max abs > %g, or cosine < %g, or max abs > %g\n",
               ru->cos, ru->abs, ru->cos_fail, ru->abs_fail);
        printf("%-6s %-12s %10s %10s %10s %10s %10s  %s\n", "result", "dtypes", "count", "cosine",
               "max abs", "max rel", "RMSE", "tensor");
        for (int32_t i = 0; i < n; i++) {
            const row *r = &rows[i];
            if (r->problem)
                printf("%-6s %-12s %54s  %s", "FAIL", r->dtypes, r->problem, r->name);
            else
                printf("%-6s %-12s %10lld %10.6f %10.3e %10.3e %10.3e  %s",
                       r->fail ? "FAIL" : "pass", r->dtypes, (long long)r->count, r->cosine,
                       r->max_abs, r->max_rel, r->rmse, r->name);
            printf("%s\n", i == first ? "   <- the first failure" : "");
        }
        printf("%d tensors compared, %d failing%s%s\n", (int)n, (int)n_fail,
               first >= 0 ? "; the first in graph order: " : "",
               first >= 0 ? rows[first].name : "");
    }
    if (html) {
        FILE *f = fopen(html, "w");
        if (!f) {
            fprintf(stderr, "loom-ir: compare: cannot write %s\n", html);
            rc = 2;
        } else {
            write_html(f, path_a, path_b, rows, n, first, n_fail);
            if (fclose(f) != 0) {
                fprintf(stderr, "loom-ir: compare: cannot write %s\n", html);
                rc = 2;
            }
        }
    }
    free(ea);
    free(eb);
    free(rows);
    loom_safetensors_close(fa);
    loom_safetensors_close(fb);
    return rc;
}
