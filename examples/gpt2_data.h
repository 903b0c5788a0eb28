/* Token sources of examples/gpt2: llm.c's token shards (--data) and a file's bytes (--text),
 * cut into batches of [B, T] inputs and their next tokens. */
#ifndef LOOM_EXAMPLES_GPT2_DATA_H
#define LOOM_EXAMPLES_GPT2_DATA_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gpt2_tokens {
    int64_t n;
    uint16_t *tok; /* owned */
} gpt2_tokens;

/* llm.c's shard: 256 int32 header (magic 20240520, version 1, header[2] the token count),
 * then that many uint16 tokens. Every token must be below vocab. 0, or 1 after a message. */
int gpt2_tokens_load_llmc(gpt2_tokens *t, const char *path, int64_t vocab);
/* Every byte of the file as a token (vocabulary 256). 0, or 1 after a message. */
int gpt2_tokens_load_text(gpt2_tokens *t, const char *path);
void gpt2_tokens_free(gpt2_tokens *t);

/* Batch k's rows [row0, row0 + rows) of B rows of T tokens: in (rows x T) and the targets out
 * (the next tokens). In order, batch k is tokens[k*B*T : (k+1)*B*T + 1], wrapping around the
 * file; shuffled, row r starts at an offset drawn from (seed, k, r). */
void gpt2_batch(const gpt2_tokens *t, int64_t k, int64_t B, int64_t T, int64_t row0, int64_t rows,
                bool shuffle, uint64_t seed, int64_t *in, int64_t *out);

#endif
