"""The served model's own chat template: read from the GGUF, rendered with jinja2 in a sandbox.

GGUF files carry the Hugging Face template under ``tokenizer.chat_template``;
it is rendered the way ``transformers`` renders it (trim and lstrip blocks,
the loop-controls extension, ``raise_exception``), inside jinja2's immutable
sandbox so a template cannot reach the process. A model without a template
gets ChatML.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: ChatML, for engines whose model carries no template (and for tests).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateError(Exception):
    """The template could not be compiled or rendered (``raise_exception`` included)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template.

    ``source``: the jinja2 text; ``bos_token`` / ``eos_token``: the strings
    templates refer to. ``render(messages, add_generation_prompt=True)``
    returns the prompt text; ``messages`` is a list of ``{"role", "content"}``
    dicts. Thinking is turned off (``enable_thinking=False``) for the
    templates that read the flag. Raises :class:`TemplateError`.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                enable_thinking=False,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed to render: {exc}") from exc

    @classmethod
    def chatml(cls) -> "ChatTemplate":
        return cls(CHATML, name="chatml")

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ChatTemplate":
        """The template of the GGUF at ``path``, or ChatML when it has none.

        Reads ``tokenizer.chat_template`` and the BOS / EOS token strings with
        ``gguf.GGUFReader`` (memory-mapped; only the metadata is touched).
        Raises ``OSError`` when the file cannot be read, ``ValueError`` when
        it is not a GGUF.
        """
        from gguf import GGUFReader

        reader = GGUFReader(str(path), "r")

        def field(name: str):
            f = reader.fields.get(name)
            return None if f is None else f.contents()

        source = field("tokenizer.chat_template")
        tokens = field("tokenizer.ggml.tokens")

        def token(key: str) -> str:
            tid = field(key)
            if tokens is None or tid is None or not (0 <= int(tid) < len(tokens)):
                return ""
            return str(tokens[int(tid)])

        if not source:
            return cls.chatml()
        return cls(str(source), token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"), name=Path(path).name)
