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
Tools and tool calls go in as vLLM hands them to the template (vllm_tool, vllm_messages);
a template without a tools block has them refused (text null).

Run: python3 tests/chat/make-cases.py  (needs jinja2; the output is committed).
"""
import copy
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


def vllm_tool(tool):
    """A request's tool as vLLM hands it to the template: its pydantic model dumped
    (ChatCompletionToolsParam: type, then function's name, description, parameters)."""
    f = tool["function"]
    return {"type": "function", "function": {"name": f["name"],
                                             "description": f.get("description"),
                                             "parameters": f.get("parameters")}}


def vllm_messages(messages):
    """vLLM's conversation: an assistant turn's tool-call arguments (JSON strings in the
    request) parsed, as its chat_utils does for Hugging Face templates."""
    out = []
    for msg in messages:
        msg = copy.deepcopy(msg)
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            for call in msg["tool_calls"]:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        out.append(msg)
    return out


def render(template, messages, add_generation_prompt, kwargs, tools=None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    return env.from_string(template).render(
        messages=vllm_messages(messages), documents=None,
        tools=None if tools is None else [vllm_tool(t) for t in tools],
        add_generation_prompt=add_generation_prompt, **kwargs)


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
# Tools (an OpenAI request's "tools") and assistant tool calls (its "tool_calls", the
# arguments a JSON string). Keys out of vLLM's order, floats written as 0.0 and 1e-05, a
# missing description and parameters, and text that JSON escapes check tojson's printing.
WEATHER = {"function": {"parameters": {"type": "object", "properties": {
    "city": {"type": "string", "description": "Città, e.g. \"Paris\"\n(UTF-8: 東京)"},
    "unit": {"enum": ["c", "f"], "default": "c"},
    "days": {"type": "integer", "minimum": 0.0, "maximum": 1e1, "multipleOf": 1},
    "eps": {"type": "number", "default": 1e-05, "exclusiveMaximum": 1e+300}},
    "required": ["city"]}, "name": "get_weather",
    "description": "Weather <b>now</b> & \t later"}, "type": "function"}
CLOCK = {"type": "function", "function": {"name": "clock"}}
CALL_W = {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2.50}'}}
CALL_C = {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
CALL_S = {"id": "call_3", "type": "function",
          "function": {"name": "clock", "arguments": '"now, \\u00e9"'}}
TOOL_CONVERSATIONS = {
    "tools-user": ([WEATHER], [m("user", "Weather in Paris?")]),
    "tools-system": ([WEATHER, CLOCK], [m("system", "Be terse."), m("user", "Time?")]),
    "tool-calls": ([WEATHER, CLOCK],
                   [m("user", "Weather?"), m("assistant", "", tool_calls=[CALL_W]),
                    m("tool", '{"t": 21.0}'), m("assistant", "21 degrees."), m("user", "Time?")]),
    "tool-calls-content": ([CLOCK], [m("user", "q"),
                                     m("assistant", "Checking both.", tool_calls=[CALL_W, CALL_C]),
                                     m("tool", "a"), m("tool", "b")]),
    "tool-calls-think": ([CLOCK], [m("user", "q"),
                                   m("assistant", "<think>\nplan\n</think>\n\n",
                                     tool_calls=[CALL_C]),
                                   m("tool", "12:00"),
                                   m("assistant", "Noon.", reasoning_content="read it",
                                     tool_calls=[CALL_S])]),
    "tool-calls-no-tools": (None, [m("user", "q"), m("assistant", "x", tool_calls=[CALL_S]),
                                   m("tool", "r"), m("user", "q2")]),
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
        # Tools or tool calls where the template has no tools block: refused (null).
        has_tools = "{{- tool | tojson }}" in template
        for conv, (tools, messages) in TOOL_CONVERSATIONS.items():
            for gen in (True, False):
                text = render(template, messages, gen, {}, tools) if has_tools else None
                out.append({"template": name, "case": conv, "tools": tools, "messages": messages,
                            "add_generation_prompt": gen, "enable_thinking": None,
                            "text": text})
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
