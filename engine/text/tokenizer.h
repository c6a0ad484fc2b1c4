/*
 * tokenizer.h — byte-level BPE tokenizer (GPT-2 style, as Qwen2/Qwen3 use it),
 * read from a GGUF's `tokenizer.ggml.*` keys, plus ChatML chat rendering.
 *
 * Encoding matches Hugging Face `tokenizers` with add_special_tokens=false:
 *   1. added tokens (GGUF token types CONTROL and USER_DEFINED) are split out of
 *      the raw text first, leftmost match, longest first;
 *   2. every other segment is NFC-normalized (utf8proc), split with the `qwen2`
 *      pre-tokenizer regex (PCRE2, UTF + UCP, run as written), mapped byte-wise
 *      through the GPT-2 byte-to-unicode table, and merged by BPE rank;
 *   3. BOS is prepended only when tokenizer.ggml.add_bos_token says so.
 * A tokenizer is immutable after loading: one may be shared by threads.
 */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpi.h"

struct gguf_file;
struct tokenizer; /* opaque */

/* Token types as GGUF's tokenizer.ggml.token_type numbers them (llama.cpp). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* A byte string view (not NUL-terminated). */
struct tok_str {
    const char *data;
    size_t len;
};

/* Everything a tokenizer is built from, as plain arrays (the GGUF loader fills
 * one of these; tests may fill one from tokenizer.json). Nothing is retained:
 * tok_init_from_arrays copies what it needs. */
struct tok_vocab_spec {
    const struct tok_str *tokens; /* n_tokens stored token strings (byte-level form) */
    int32_t n_tokens;
    const int32_t *types;         /* n_tokens enum tok_type values, or NULL: all NORMAL */
    const struct tok_str *merges; /* n_merges "left right" strings, rank = index */
    int32_t n_merges;
    const char *pre;                /* pre-tokenizer name; only "qwen2" (NULL means qwen2) */
    int32_t bos_id, eos_id, pad_id; /* -1 when absent */
    int32_t eot_id, eom_id;         /* tokenizer.ggml.eot/eom_token_id; -1 when absent
                                       (a zeroed spec's 0 is read as absent too) */
    bool add_bos;
    const char *chat_template; /* may be NULL */
    size_t chat_template_len;
    const char *source; /* name used in error messages (file path), may be NULL */
};

/* Build a tokenizer from arrays. On success *out owns everything (free with
 * tok_free); on error returns a status and err names the source and the entry. */
int tok_init_from_arrays(const struct tok_vocab_spec *spec, struct tokenizer **out,
                         struct tpi_error *err);

/* Build a tokenizer from an open GGUF's tokenizer.ggml.* keys (model must be
 * "gpt2", pre "qwen2"; vocab-only files are fine). The tokenizer does not keep
 * references into `f`. In a file with weights, token_embd.weight must have one row
 * a token. Errors name the file and the key. */
int tok_load(const struct gguf_file *f, struct tokenizer **out, struct tpi_error *err);

/* Free a tokenizer; sets *t to NULL. Accepts NULL. */
void tok_free(struct tokenizer **t);

/* Vocabulary size; BOS / EOS / padding ids (-1 when the file has none); whether
 * encode prepends BOS. */
int32_t tok_n_vocab(const struct tokenizer *t);
int32_t tok_bos(const struct tokenizer *t);
int32_t tok_eos(const struct tokenizer *t);
int32_t tok_pad(const struct tokenizer *t);
bool tok_add_bos(const struct tokenizer *t);

/* Most end-of-generation ids a vocabulary has (tok_eog_ids' array). */
#define TOK_MAX_EOG 16

/* True for ids that end generation, llama.cpp's set: EOS, the GGUF's EOT and EOM ids,
 * and the tokens named `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`,
 * `<|end|>`, `<end_of_turn>`, `<|end_of_text|>`, `<EOT>`, `<|return|>`, `<|call|>`, and
 * the FIM tokens `<|fim_pad|>`, `<|repo_name|>`, `<|file_sep|>` (Qwen2.5-Coder's). */
bool tok_is_eog(const struct tokenizer *t, int32_t id);

/* Those ids, each once, into ids[0..TOK_MAX_EOG); returns how many there are. */
int tok_eog_ids(const struct tokenizer *t, int32_t ids[TOK_MAX_EOG]);

/* Type of token `id` (enum tok_type); -1 when out of range. */
int tok_type_of(const struct tokenizer *t, int32_t id);

/* Id of the token whose stored string is exactly `text` (NUL-terminated), e.g.
 * "<|im_start|>" or "Ġthe"; -1 when there is none. */
int32_t tok_id_of(const struct tokenizer *t, const char *text);

/* Stored string of token `id` (byte-level form, e.g. "Ġthe"), a view valid for
 * the tokenizer's lifetime and NUL-terminated; {NULL, 0} when out of range. */
struct tok_str tok_piece(const struct tokenizer *t, int32_t id);

/* The bytes token `id` decodes to (byte-level decoded; added tokens as their
 * text), a view valid for the tokenizer's lifetime; {NULL, 0} when out of range. */
struct tok_str tok_token_bytes(const struct tokenizer *t, int32_t id);

/* The GGUF's tokenizer.chat_template (NUL-terminated), or NULL when absent. */
const char *tok_chat_template(const struct tokenizer *t);

/* Encode `len` bytes of UTF-8 `text` (need not be NUL-terminated). With
 * parse_special, CONTROL tokens written in the text (e.g. "<|im_start|>") become
 * their ids; USER_DEFINED added tokens (e.g. "<think>") always do, as in HF and
 * llama.cpp. *ids is malloc'd (caller frees; non-NULL even when *n_ids == 0).
 * Invalid UTF-8 is TPI_ERR_INVALID naming the byte offset. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool parse_special,
               int32_t **ids, int *n_ids, struct tpi_error *err);

/* Decode ids to bytes, every token rendered (added tokens as their text). *out is
 * malloc'd and NUL-terminated (caller frees), *n_bytes its length. An id out of
 * range is TPI_ERR_INVALID naming its index. */
int tok_decode(const struct tokenizer *t, const int32_t *ids, int n_ids, char **out,
               size_t *n_bytes, struct tpi_error *err);

/* ---- streaming decode ------------------------------------------------------
 * Feed generated ids one at a time and get back only complete UTF-8: a token
 * that ends inside a multi-byte character has those bytes held back until the
 * character completes. Output is always valid UTF-8: bytes that cannot start or
 * continue a character become U+FFFD, one for each maximal subpart of a broken
 * character (a cut-off one is one U+FFFD), as Python's and Rust's lossy decoders do. */
struct tok_stream; /* opaque */

/* New stream over `t`; with render_control false, CONTROL tokens (e.g.
 * <|im_end|>) produce no text. NULL on OOM. Free with tok_stream_free. */
struct tok_stream *tok_stream_new(const struct tokenizer *t, bool render_control);
void tok_stream_free(struct tok_stream **s);

/* Push one id; *bytes / *n_bytes receive the text that is now complete (a view
 * into the stream, valid until the next call; may be empty). */
int tok_stream_push(struct tok_stream *s, int32_t id, const char **bytes, size_t *n_bytes,
                    struct tpi_error *err);

/* End of stream: whatever is still held back (an incomplete character) comes out
 * as U+FFFD. Same view rules as tok_stream_push; the stream is reset after. */
void tok_stream_flush(struct tok_stream *s, const char **bytes, size_t *n_bytes);

/* ---- chat ----------------------------------------------------------------- */

/* One tool call of an assistant turn, as vLLM hands it to the template: the arguments
 * (an OpenAI request's JSON string) parsed, so `tojson` prints them again. */
struct tok_tool_call {
    char *name;          /* the function's name */
    char *arguments;     /* the arguments as the template's tojson prints them */
    char *arguments_str; /* where the arguments are one JSON string: its value, which
                            Qwen3's template prints as is; else NULL */
};

/* A tool call from an OpenAI request's function name and arguments (JSON text), into *c
 * (free with tok_tool_call_free). TPI_ERR_INVALID when the arguments are not one JSON
 * value tpinfer can print as Python would (why in err), TPI_ERR_NOMEM. */
int tok_tool_call_init(struct tok_tool_call *c, const char *name, const char *arguments,
                       struct tpi_error *err);
void tok_tool_call_free(struct tok_tool_call *c);

/* An OpenAI request's tool definition, the JSON object [b, e), as vLLM hands it to the
 * template (its pydantic model dumped: {"type": "function", "function": {"name", "description",
 * "parameters"}}, absent fields null) and tojson prints it; malloc'd. NULL with err
 * (TPI_ERR_INVALID naming the field, TPI_ERR_UNSUPPORTED for "strict": true) otherwise. */
char *tok_tool_json(const char *b, const char *e, struct tpi_error *err);

/* The tool calls in generated text as vLLM's hermes parser (the Qwen family's) finds
 * them: every "<tool_call>" up to its "</tool_call>" (or the text's end) is a JSON object
 * with a "name" string and "arguments", printed again as json.dumps prints them. On
 * success *calls (free each with tok_tool_call_free, then the array) and *content_len
 * (the text before the first block) are set and the count returned; 0 when the text has
 * no block or any block does not parse (then the whole text is the content, as vLLM
 * falls back); -1 when memory ran out. */
int tok_parse_tool_calls(const char *text, struct tok_tool_call **calls, size_t *content_len);

/* One chat message; the strings NUL-terminated. */
struct tok_message {
    const char *role;              /* "system", "user", "assistant", "tool", ... */
    const char *content;           /* NULL renders as "" */
    const char *reasoning_content; /* an assistant turn's reasoning given apart from its
                                      content (vLLM's field); NULL when not given */
    const struct tok_tool_call *tool_calls; /* an assistant turn's calls (n_tool_calls) */
    int n_tool_calls;
};

/* How to render a conversation. */
struct tok_chat_opts {
    bool add_generation_prompt; /* end with the assistant's turn opened */
    int enable_thinking;        /* the template variable: -1 unset, 0 false, 1 true */
    bool continue_final;        /* end right after the last message's content (its
                                   surrounding whitespace stripped), so the model goes on
                                   with it: Hugging Face's continue_final_message; not
                                   with add_generation_prompt */
    const char *const *tools;   /* n_tools tool definitions, each as tok_tool_json gives
                                   it: the template's tools block (none when n_tools is 0) */
    int n_tools;
};

/* Render messages as the model's tokenizer.chat_template does, for the ChatML templates
 * of the Qwen family (`<|im_start|>ROLE\nCONTENT<|im_end|>\n` per message), without
 * running Jinja: the template is inspected for what it adds to plain ChatML and that is
 * rendered too — a default system message (Qwen2, Qwen2.5), "tool" messages as user
 * turns of <tool_response> blocks (Qwen2.5, Qwen3), an assistant turn's <think> block
 * dropped before the last user query and written out after it (Qwen3) or dropped
 * everywhere (QwQ); the template's own generation-prompt block is run (its literals and
 * its tests of enable_thinking: Qwen3's empty think block when it is 0, templates that
 * always open one), and continue_final cuts the text after the last message's content
 * as Hugging Face does. Tools and assistant tool calls are rendered where the template
 * is Qwen2.5's or Qwen3's form of them (the tools block's text taken from the template);
 * any other template given them is TPI_ERR_UNSUPPORTED. A template that reads roles by name renders
 * only system, user, assistant and tool: any other role is TPI_ERR_UNSUPPORTED naming the message,
 * as is a template that is not ChatML (no "<|im_start|>"); without a template the vocabulary's
 * <|im_start|> gives plain ChatML. opts NULL: the generation prompt, enable_thinking unset. *out is
 * malloc'd, NUL-terminated (caller frees). Encode the result with parse_special = true. */
int tok_apply_chat(const struct tokenizer *t, const struct tok_message *msgs, int n_msgs,
                   const struct tok_chat_opts *opts, char **out, size_t *n_bytes,
                   struct tpi_error *err);

#endif /* TOKENIZER_H */
