#!/usr/bin/env python3
"""Cross-check of the chat-template tests against jinja2 configured as transformers configures it.

Re-renders every row of test_chat_template.cc (the family templates of src/generation/family_templates.h) and every
language case of test_jinja.cc with jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, transformers' tojson, raise_exception and strftime_now) and reports rows whose expected string (or
raise_exception message) differs. Needs python3-jinja2; not part of the meson suite (a developer's check):

    python3 tests/generation/test_chat_template_reference.py
"""
import ast
import datetime
import json
import os
import re
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CLOCK = 1733227200  # 2024-12-03 12:00 UTC, the tests' injected clock
S = r'"((?:[^"\\]|\\.)*)"'


def env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = lambda fmt: datetime.datetime.fromtimestamp(CLOCK).strftime(fmt)
    return e


def render(src, messages, agp=True, bos="<s>", eos="</s>"):
    return env().from_string(src).render(messages=messages, add_generation_prompt=agp, bos_token=bos,
                                         eos_token=eos, tools=None, documents=None)


def c_string(s):
    return ast.literal_eval('"' + s + '"')


def families():
    text = open(os.path.join(HERE, "..", "..", "src", "generation", "family_templates.h"), encoding="utf-8").read()
    return {m.group(1): m.group(2) for m in re.finditer(r'\{"(\w+)", "[^"]*",\s*R"TPL\((.*?)\)TPL"\}', text, re.S)}


CONVERSATIONS = {
    "full": [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
             {"role": "assistant", "content": " Hi there "}, {"role": "user", "content": "Who are you"}],
    "no_system": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"},
                  {"role": "user", "content": "Who are you"}],
    "not_alternating": [{"role": "user", "content": "Hello"}, {"role": "user", "content": "Hello again"}],
}


def check_families():
    templates = families()
    text = open(os.path.join(HERE, "test_chat_template.cc"), encoding="utf-8").read()
    bad = rows = 0
    row = r'\{' + S + r', ' + S + r', (true|false), ' + S + r', ' + S + r', ' + S + r', ' + S + r'\}'
    for m in re.finditer(row, text):
        family, conv, agp, bos, eos, expected, error = m.groups()
        rows += 1
        try:
            got, got_err = render(templates[family], CONVERSATIONS[conv], agp == "true", c_string(bos), c_string(eos)), ""
        except jinja2.exceptions.TemplateError as ex:
            got, got_err = "", str(ex)
        if (got, got_err) != (c_string(expected), c_string(error)):
            bad += 1
            print(f"MISMATCH {family}/{conv}: jinja2 gives {got!r} {got_err!r}")
    return rows, bad


def check_language():
    text = open(os.path.join(HERE, "test_jinja.cc"), encoding="utf-8").read()
    block = text[text.index("const Case kCases[]"):text.index("// clang-format on")]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello!"}]
    bad = rows = 0
    for m in re.finditer(r'\{' + S + r',\s*' + S + r',\s*' + S + r'\}', block):
        name, src, expected = (c_string(g) for g in m.groups())
        if "generation" in src:  # transformers' AssistantTracker tag; plain jinja2 lacks it
            continue
        rows += 1
        try:
            got = render(src, messages)
        except Exception as ex:  # noqa: BLE001 — report whatever jinja2 says
            got = f"EXCEPTION {ex!r}"
        if got != expected:
            bad += 1
            print(f"MISMATCH {name}: jinja2 gives {got!r}, the test expects {expected!r}")
    return rows, bad


if __name__ == "__main__":
    f_rows, f_bad = check_families()
    l_rows, l_bad = check_language()
    print(f"families: {f_rows} rows, {f_bad} mismatches; language: {l_rows} cases, {l_bad} mismatches")
    sys.exit(1 if (f_bad or l_bad or not f_rows or not l_rows) else 0)
