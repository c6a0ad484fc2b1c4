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

    /* size first, then one allocation */
    size_t per_msg = strlen(IM_START) + 1 + strlen(IM_END) + 1; /* "\n" after role and end */
    size_t total = 0;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].role[0])
            return tpi_err(err, TPI_ERR_INVALID, "chat message %d has no role", i);
        total += per_msg + strlen(msgs[i].role) + (msgs[i].content ? strlen(msgs[i].content) : 0);
    }
    const char gen[] = "<|im_start|>assistant\n";
    if (add_generation_prompt) total += strlen(gen);
    char *buf = malloc(total + 1);
    if (!buf) return tpi_err(err, TPI_ERR_NOMEM, "tok_apply_chat: out of memory");
    size_t o = 0;
#define PUT(s)                                                                                     \
    do {                                                                                           \
        size_t l_ = strlen(s);                                                                     \
        memcpy(buf + o, (s), l_);                                                                  \
        o += l_;                                                                                   \
    } while (0)
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
