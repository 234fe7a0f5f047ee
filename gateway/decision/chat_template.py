"""What the gateway reads from the served GGUF: its chat template (rendered with jinja2 in a
sandbox) and the text of its tokens.

GGUF files carry the Hugging Face template under ``tokenizer.chat_template``;
it is rendered the way ``transformers`` renders it (trim and lstrip blocks,
the loop-controls extension, ``raise_exception``), inside jinja2's immutable
sandbox so a template cannot reach the process. A model without a template
gets ChatML. Token texts (for the ``top_logprobs`` of ``/v1/completions``,
where the engine reports alternatives by token id) are decoded from
``tokenizer.ggml.tokens``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from gguf import GGUFReader  # imports numpy: read only where a GGUF is opened (read_gguf)

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
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
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
    def chatml(cls) -> ChatTemplate:
        return cls(CHATML, name="chatml")

    @classmethod
    def from_gguf(cls, path: str | Path) -> ChatTemplate:
        return read_gguf(path)[0]

    @classmethod
    def _from_reader(cls, reader: GGUFReader, path: str | Path) -> ChatTemplate:
        """The template of the GGUF at ``path``, or ChatML when it has none.

        Reads ``tokenizer.chat_template`` and the BOS / EOS token strings with
        ``gguf.GGUFReader`` (memory-mapped; only the metadata is touched).
        Raises ``OSError`` when the file cannot be read, ``ValueError`` when
        it is not a GGUF.
        """

        def field(name: str) -> Any:
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
        return cls(
            str(source),
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
            name=Path(path).name,
        )


def _gpt2_byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level BPE writes each byte as one printable character: the
    # printable Latin-1 bytes as themselves, the other 68 as U+0100 onwards in
    # byte order (Radford et al. 2019, ``bytes_to_unicode``).
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in keep:
            table[chr(0x100 + extra)] = b
            extra += 1
    return table


_GPT2 = _gpt2_byte_decoder()


def token_pieces(tokens: list[str], model: str | None, types: list[int] | None) -> list[bytes]:
    """The bytes of each token of a GGUF vocabulary.

    ``model``: ``tokenizer.ggml.model`` (``gpt2``: byte-level BPE; ``llama``:
    SentencePiece, ``\u2581`` is a space and ``<0xNN>`` a byte); ``types``:
    ``tokenizer.ggml.token_type`` (1 normal; control and user-defined tokens
    keep their literal text). Unknown models keep the UTF-8 of the text.
    """
    out = []
    for i, t in enumerate(tokens):
        kind = types[i] if types is not None and i < len(types) else 1
        if model == "gpt2" and kind == 1:
            try:
                out.append(bytes(_GPT2[c] for c in t))
                continue
            except KeyError:
                pass
        if model == "llama":
            if kind == 6 and len(t) == 6 and t.startswith("<0x"):
                out.append(bytes([int(t[3:5], 16)]))
                continue
            out.append(t.replace("\u2581", " ").encode("utf-8"))
            continue
        out.append(t.encode("utf-8"))
    return out


def read_gguf(path: str | Path) -> tuple[ChatTemplate, list[bytes] | None]:
    """The chat template (ChatML when the GGUF has none) and the token pieces of the GGUF at ``path``.

    One ``gguf.GGUFReader`` pass (memory-mapped). Blocking: seconds on a slow
    disk, so call it in a worker thread. Raises ``OSError`` / ``ValueError``
    for a file that cannot be read or is not a GGUF.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")
    template = ChatTemplate._from_reader(reader, path)

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        return None if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens")
    pieces = None
    if tokens:
        pieces = token_pieces(
            [str(t) for t in tokens], field("tokenizer.ggml.model"), field("tokenizer.ggml.token_type")
        )
    return template, pieces
