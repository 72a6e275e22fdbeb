#!/usr/bin/env python3
"""render_chat_template.py - renders a Jinja chat template the way Hugging Face's
apply_chat_template does (jinja2's sandbox, trim_blocks, lstrip_blocks, raise_exception,
strftime_now), for tests that compare kvtop's hand-written chat formats with the real template.

usage: tools/render_chat_template.py REQUEST.json
REQUEST: {"template": TEXT, "messages": [{"role", "content"}...], "add_generation_prompt": bool,
          "bos_token": TEXT, "eos_token": TEXT}
Writes the rendered text to stdout, exactly (no newline added). Exit 3 when jinja2 is missing,
2 when the template raises (e.g. a role it does not support), 1 on other errors.
"""
import json
import sys

try:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit(3)


class TemplateRaised(Exception):
    pass


def raise_exception(msg):
    raise TemplateRaised(msg)


def main():
    req = json.load(open(sys.argv[1], encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"
    try:
        text = env.from_string(req["template"]).render(
            messages=req["messages"], add_generation_prompt=req["add_generation_prompt"],
            bos_token=req.get("bos_token", ""), eos_token=req.get("eos_token", ""))
    except TemplateRaised as e:
        print(e, file=sys.stderr)
        return 2
    sys.stdout.buffer.write(text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
