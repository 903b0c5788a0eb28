/* Token files of examples/gpt2 and their batches (see gpt2_data.h). */
#include "gpt2_data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_util.h"

void gpt2_tokens_free(gpt2_tokens *t) {
    free(t->tok);
    *t = (gpt2_tokens){0};
}

/* The file's size, opened; NULL after a message. */
static FILE *open_sized(const char *flag, const char *path, int64_t *size) {
    FILE *fp = fopen(path, "rb");
    struct stat sb;
    if (!fp || fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "%s%s %s: %s\n", ex_who(), flag, path,
                fp ? "not a regular file" : strerror(errno));
        if (fp)
            fclose(fp);
        return NULL;
    }
    *size = (int64_t)sb.st_size;
    return fp;
}

int gpt2_tokens_load_llmc(gpt2_tokens *t, const char *path, int64_t vocab) {
    *t = (gpt2_tokens){0};
    int64_t size;
    FILE *fp = open_sized("--data", path, &size);
    if (!fp)
        return 1;
    int rc = 1;
    int32_t h[256];
    if (fread(h, sizeof h, 1, fp) != 1) {
        fprintf(stderr, "%s--data %s: shorter than llm.c's 1024-byte header\n", ex_who(), path);
        goto out;
    }
    if (h[0] != 20240520 || h[1] != 1) {
        fprintf(stderr,
                "%s--data %s: not an llm.c token file (magic %d version %d; expected 20240520 "
                "version 1)\n",
                ex_who(), path, (int)h[0], (int)h[1]);
        goto out;
    }
    int64_t n = h[2];
    if (n < 2 || 1024 + 2 * n > size) {
        fprintf(stderr,
                "%s--data %s: the header counts %" PRId64 " tokens (%" PRId64
                " bytes) but the file has %" PRId64 " bytes%s\n",
                ex_who(), path, n, 1024 + 2 * n, size, n < 2 ? " (at least 2 tokens needed)" : "");
        goto out;
    }
    t->tok = malloc((size_t)n * sizeof *t->tok);
    if (!t->tok || fread(t->tok, sizeof *t->tok, (size_t)n, fp) != (size_t)n) {
        fprintf(stderr, "%s--data %s: %s\n", ex_who(), path,
                t->tok ? "read error" : "out of memory");
        goto out;
    }
    t->n = n;
    for (int64_t i = 0; i < n; i++)
        if (t->tok[i] >= vocab) {
            fprintf(stderr,
                    "%s--data %s: token %d at position %" PRId64
                    " is outside the vocabulary of %" PRId64 "\n",
                    ex_who(), path, (int)t->tok[i], i, vocab);
            goto out;
        }
    rc = 0;
out:
    if (rc)
        gpt2_tokens_free(t);
    fclose(fp);
    return rc;
}

int gpt2_tokens_load_text(gpt2_tokens *t, const char *path) {
    *t = (gpt2_tokens){0};
    int64_t size;
    FILE *fp = open_sized("--text", path, &size);
    if (!fp)
        return 1;
    int rc = 1;
    unsigned char *bytes = malloc((size_t)(size > 0 ? size : 1));
    t->tok = malloc((size_t)(size > 0 ? size : 1) * sizeof *t->tok);
    if (size < 2) {
        fprintf(stderr, "%s--text %s: %" PRId64 " bytes; at least 2 are needed\n", ex_who(), path,
                size);
        goto out;
    }
    if (!bytes || !t->tok || fread(bytes, 1, (size_t)size, fp) != (size_t)size) {
        fprintf(stderr, "%s--text %s: %s\n", ex_who(), path,
                bytes ? "read error" : "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < size; i++)
        t->tok[i] = bytes[i];
    t->n = size;
    rc = 0;
out:
    free(bytes);
    if (rc)
        gpt2_tokens_free(t);
    fclose(fp);
    return rc;
}

static uint64_t mix(uint64_t z) {
    return ex_splitmix64(&z);
}

void gpt2_batch(const gpt2_tokens *t, int64_t k, int64_t B, int64_t T, int64_t row0, int64_t rows,
                bool shuffle, uint64_t seed, int64_t *in, int64_t *out) {
    uint64_t n = (uint64_t)t->n;
    for (int64_t r = 0; r < rows; r++) {
        uint64_t start;
        if (shuffle) /* as nanoGPT's get_batch: a random window per row */
            start = mix(seed ^ mix((uint64_t)k * 0x100000001B3ull + (uint64_t)(row0 + r))) % n;
        else
            start = ((uint64_t)k * (uint64_t)(B * T) + (uint64_t)((row0 + r) * T)) % n;
        for (int64_t j = 0; j < T; j++) {
            in[r * T + j] = t->tok[(start + (uint64_t)j) % n];
            out[r * T + j] = t->tok[(start + (uint64_t)j + 1) % n];
        }
    }
}
