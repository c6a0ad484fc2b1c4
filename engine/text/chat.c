/*
 * chat.c — chat rendering for tok_apply_chat (tokenizer.h).
 *
 * We do not run Jinja: the Qwen family's templates all reduce to ChatML for
 * plain role/content messages, so the template is only inspected to decide that
 * it is ChatML. Anything else is refused with a clear error rather than being
 * rendered in a format the model was not trained on.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static const char IM_START[] = "<|im_start|>";
static const char IM_END[] = "<|im_end|>";

/* The default system prompt a ChatML template adds when the conversation has none
 * (Qwen2.5's: "You are Qwen, created by Alibaba Cloud. ..."): the literal in a
 * `'<|im_start|>system\n...<|im_end|>\n'` Jinja string, as opposed to the one that
 * concatenates messages[0]['content']. Returns a malloc'd copy (Jinja's "\n" escapes
 * turned into newlines), or NULL when the template has none (Qwen3, plain ChatML). */
static char *default_system(const char *tmpl) {
    static const char open[] = "'<|im_start|>system\\n";
    static const char close[] = "<|im_end|>\\n'";
    for (const char *p = tmpl ? strstr(tmpl, open) : NULL; p; p = strstr(p + 1, open)) {
        const char *b = p + strlen(open), *e = strstr(b, close);
        if (!e || e == b || memchr(b, '\'', (size_t)(e - b))) continue; // '+ messages...'
        char *out = malloc((size_t)(e - b) + 1);
        if (!out) return NULL;
        size_t o = 0;
        for (const char *q = b; q < e; q++) {
            if (q[0] == '\\' && q + 1 < e && q[1] == 'n') {
                out[o++] = '\n';
                q++;
            } else {
                out[o++] = *q;
            }
        }
        out[o] = '\0';
        return out;
    }
    return NULL;
}

int tok_apply_chat(const struct tokenizer *t, const struct tok_message *msgs, int n_msgs,
                   bool add_generation_prompt, char **out, size_t *n_bytes, struct tpi_error *err) {
    *out = NULL;
    if (n_bytes) *n_bytes = 0;
    const char *tmpl = tok_chat_template(t);
    if (tmpl && !strstr(tmpl, IM_START))
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "tokenizer.chat_template is not ChatML (no '<|im_start|>'); only ChatML "
                       "chats are supported");
    if (tok_id_of(t, IM_START) < 0 || tok_id_of(t, IM_END) < 0)
        return tpi_err(err, TPI_ERR_UNSUPPORTED,
                       "the vocabulary has no '<|im_start|>'/'<|im_end|>' tokens, so it cannot "
                       "render ChatML%s",
                       tmpl ? "" : " (and tokenizer.chat_template is absent)");
    if (n_msgs < 0 || (n_msgs > 0 && !msgs))
        return tpi_err(err, TPI_ERR_INVALID, "tok_apply_chat: bad message list");

    /* A conversation without a system message gets the template's default one, as the
     * template itself renders it. */
    char *sys = (n_msgs == 0 || !msgs[0].role || strcmp(msgs[0].role, "system"))
                    ? default_system(tmpl)
                    : NULL;
    /* size first, then one allocation */
    size_t per_msg = strlen(IM_START) + 1 + strlen(IM_END) + 1; /* "\n" after role and end */
    size_t total = sys ? per_msg + strlen("system") + strlen(sys) : 0;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].role[0]) {
            free(sys);
            return tpi_err(err, TPI_ERR_INVALID, "chat message %d has no role", i);
        }
        total += per_msg + strlen(msgs[i].role) + (msgs[i].content ? strlen(msgs[i].content) : 0);
    }
    const char gen[] = "<|im_start|>assistant\n";
    if (add_generation_prompt) total += strlen(gen);
    char *buf = malloc(total + 1);
    if (!buf) {
        free(sys);
        return tpi_err(err, TPI_ERR_NOMEM, "tok_apply_chat: out of memory");
    }
    size_t o = 0;
#define PUT(s)                                                                                     \
    do {                                                                                           \
        size_t l_ = strlen(s);                                                                     \
        memcpy(buf + o, (s), l_);                                                                  \
        o += l_;                                                                                   \
    } while (0)
    if (sys) {
        PUT(IM_START);
        PUT("system\n");
        PUT(sys);
        PUT(IM_END);
        PUT("\n");
        free(sys);
    }
    for (int i = 0; i < n_msgs; i++) {
        PUT(IM_START);
        PUT(msgs[i].role);
        PUT("\n");
        if (msgs[i].content) PUT(msgs[i].content);
        PUT(IM_END);
        PUT("\n");
    }
    if (add_generation_prompt) PUT(gen);
#undef PUT
    buf[o] = '\0';
    *out = buf;
    if (n_bytes) *n_bytes = o;
    return TPI_OK;
}
