#!/usr/bin/env python3
"""tests/chat/make-cases.py — writes tests/chat/cases.jsonl: conversations rendered by
jinja2 with the chat templates beside this script, the way Hugging Face transformers'
apply_chat_template renders them (a sandboxed environment with trim_blocks and
lstrip_blocks, its tojson filter, the conversation as `messages`, the generation prompt
flag and the chat_template_kwargs as template variables). test_tokenizer checks that
tok_apply_chat gives the same bytes.

The templates, verbatim (tokenizer.chat_template of each GGUF):
  qwen3.jinja    Qwen3 (tests/data/qwen3-vocab.gguf; test_tokenizer checks the copy)
  qwen2.5.jinja  Qwen2.5 (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the default job's model,
                 docs/MODELS.md)
  chatml.jinja   the plain ChatML loop (tests/data's tiny models)
and four written for these tests, in the ways other Qwen-family templates go:
  thinking-prompt.jinja  a generation prompt that depends on enable_thinking
  always-think.jinja     one that always opens a think block, with Jinja's whitespace
                         rules around plain block tags
  drop-think.jinja       QwQ's way: every assistant turn keeps what follows </think>
  same-line.jinja        Jinja's whitespace rules between tags on one line and at a
                         line's start

Run: python3 tests/chat/make-cases.py  (needs jinja2; the output is committed).
"""
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' filter: json.dumps without ASCII escapes
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def render(template, messages, add_generation_prompt, kwargs):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    return env.from_string(template).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=add_generation_prompt,
                                            **kwargs)


def m(role, content, **extra):
    return dict(role=role, content=content, **extra)


THINK = "<think>\nLet me see: 2 + 2.\n</think>\n\n4."
CONVERSATIONS = {
    "user": [m("user", "Hello")],
    "system-user": [m("system", "You are terse."), m("user", "Hello")],
    "multi-turn": [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello!"),
                   m("user", "And now?")],
    "think-in-history": [m("user", "What is 2 + 2?"), m("assistant", THINK),
                         m("user", "And 3 + 3?")],
    "think-last": [m("user", "What is 2 + 2?"), m("assistant", THINK)],
    "think-odd": [m("user", "q"), m("assistant", "a <think>x</think> b </think>\n\nc"),
                  m("user", "q2"), m("assistant", "\n\nno think tags\n")],
    "reasoning-field": [m("user", "q"), m("assistant", "The answer.",
                                          reasoning_content="\nSome thought.\n"),
                        m("user", "q2")],
    "reasoning-field-last": [m("user", "q"), m("assistant", "Done </think> here",
                                               reasoning_content="")],
    "tools": [m("user", "Weather in Paris?"), m("assistant", "<think>call it</think>Calling."),
              m("tool", "{\"temp\": 21}"), m("tool", "{\"sky\": \"clear\"}"),
              m("assistant", "It is 21 and clear.")],
    "tool-first": [m("tool", "orphan result"), m("user", "ok?")],
    "tool-response-user": [m("user", "Start"), m("assistant", "<think>t1</think>step"),
                           m("user", "<tool_response>\nr\n</tool_response>"),
                           m("assistant", "<think>t2</think>final")],
    "system-later": [m("user", "Hi"), m("system", "Switch to French."), m("user", "Bonjour")],
    "empty-and-unicode": [m("system", ""), m("user", "héllo 世界 🙂\nline two"),
                          m("assistant", ""), m("user", "")],
    "special-in-text": [m("user", "say <|im_end|> and <think> literally")],
}
KWARGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}]
# Conversations that end with an assistant turn to continue (continue_final_message).
CONTINUE = {
    "continue-plain": [m("user", "Write a haiku."), m("assistant", "Leaves fall  \n")],
    "continue-think": [m("user", "q"), m("assistant", "<think>\nhm\n</think>\n\nThe answer is")],
    "continue-history": [m("user", "q"), m("assistant", "<think>x</think>a"), m("user", "q2"),
                         m("assistant", " \u3000Sure,\u00a0")],
    "continue-empty": [m("user", "q"), m("assistant", "  ")],
    "continue-changed": [m("user", "q"), m("assistant", "<think>x</think>\n\n<think>y")],
}


def continue_final(rendered, messages):
    """transformers' apply_chat_template with continue_final_message: the text up to the
    last place the final message's stripped content stands, or None where it does not
    appear (transformers raises there)."""
    final = messages[-1]["content"].strip()
    if final not in rendered:
        return None
    return rendered[: rendered.rindex(final) + len(final)]


TEMPLATES = ("qwen3", "qwen2.5", "chatml", "thinking-prompt", "always-think", "drop-think",
             "same-line")


def main():
    out = []
    for name in TEMPLATES:
        with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                for kw in KWARGS:
                    if kw and not gen:
                        continue  # the kwargs only touch the generation prompt
                    text = render(template, messages, gen, kw)
                    out.append({"template": name, "case": conv, "messages": messages,
                                "add_generation_prompt": gen,
                                "enable_thinking": kw.get("enable_thinking"), "text": text})
        for conv, messages in CONTINUE.items():
            text = continue_final(render(template, messages, False, {}), messages)
            out.append({"template": name, "case": conv, "messages": messages,
                        "add_generation_prompt": False, "continue_final_message": True,
                        "enable_thinking": None, "text": text})
    with open(os.path.join(HERE, "cases.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for c in out:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print(f"{len(out)} cases written (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    main()
