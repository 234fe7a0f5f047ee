"""The llama engine's tokenization against an independent tokenizer, on text full of numbers.

SmolLM2's pre-tokenizer (the default model's, copied into the tiny fixture) first isolates every
number codepoint (``\\p{N}``: ASCII digits, other scripts' digits, superscripts, fractions, Roman
numerals), then applies GPT-2's byte-level split. llama.cpp did the first step with ``std::regex``,
compiling it on every call; patch 0008 (``engines/llama/patches/``) does it in code. Patch 0009 keeps
each word's BPE tokens, so a word seen before is not merged again. The oracle here
is Hugging Face ``tokenizers`` (Rust, a separate implementation): a BPE model built from the GGUF's own
vocabulary and merges, with the pre-tokenizers of SmolLM2's ``tokenizer.json`` (``Digits`` with
``individual_digits``, then ``ByteLevel``) and the control tokens as special tokens. The engine's ids
come from its ECHO read-out of the text (each position's token text, mapped back through the
vocabulary). Ids are compared exactly. And llama.cpp against itself: ``llama-tokenize-ref`` with
``LLAMA_UNICODE_STD_REGEX=1 LLAMA_BPE_NO_WORD_CACHE=1`` takes the stock paths (the ``std::regex`` split,
every word merged), without them the patches', on thousands of texts in one process, so that most words
come from the kept ones (random codepoints of every plane and invalid UTF-8 too, where the two
tokenizers above may part ways for reasons of their own).
"""

from __future__ import annotations

import os
import random
import subprocess

import pytest

from fixtures import vocab
from fixtures.gguf_read import GGUFFile
from gateway.paths import engine_bin
from test_oracle import _readout, engine, tiny  # noqa: F401  (fixtures)

tokenizers = pytest.importorskip("tokenizers")

#: Pieces the texts are glued from: numbers of many scripts and kinds, the words and spaces around them.
PIECES = [
    "0",
    "7",
    "42",
    "2026",
    "3.14",
    "1,000",
    "v4.2.1",
    "2026-12-04",
    "#9",
    "x1",
    "1x",
    "٣",
    "٠١٢",
    "०९",
    "\uff10\uff19",  # fullwidth 0 9
    "²",
    "³¹",
    "½",
    "¾",
    "Ⅷ",
    "ⅻ",
    "①",
    "\u3007",  # ideographic zero
    "一二三",
    "\U0001d7d8\U0001d7d9",  # double-struck 0 1
    "๓",
    " ",
    "  ",
    "\n",
    "\t",
    "\r\n",
    "\u00a0",
    "\u3000",
    "a",
    "word",
    "Zürich",
    "naïve",
    "日本語",
    "🙂",
    "$",
    "+",
    "%",
    "'s",
    "'ll",
    "ß",
    "<|im_start|>",
    "<|im_end|>",
]


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 24))) for _ in range(n)]


@pytest.fixture(scope="module")
def oracle_tokenizer(tiny):  # noqa: F811
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    def text(x):
        return x.decode() if isinstance(x, bytes) else x

    with GGUFFile(tiny) as g:
        assert text(g.get("tokenizer.ggml.pre")) == "smollm"
        tokens = [text(t) for t in g.get("tokenizer.ggml.tokens")]
        merges = [tuple(text(m).split(" ", 1)) for m in g.get("tokenizer.ggml.merges")]
        types = [int(t) for t in g.get("tokenizer.ggml.token_type")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tk.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == vocab.CONTROL]
    )
    return tk


def engine_ids(eng, tiny, text: str) -> list[int]:  # noqa: F811
    v = vocab.load(tiny)
    return [v.id_of(e.text) for e in _readout(eng, text.encode(), ids=False, k=1)]


def test_numbers_are_one_token_each_as_the_oracle_says(engine, tiny, oracle_tokenizer):  # noqa: F811
    v = vocab.load(tiny)
    ids = engine_ids(engine, tiny, "In 2026, ½ of ٣٤ is Ⅷ.")
    assert [v.pieces[i] for i in ids[1:5]] == [b" ", b"2", b"0", b"2"]  # every digit its own token
    assert ids == oracle_tokenizer.encode("In 2026, ½ of ٣٤ is Ⅷ.", add_special_tokens=False).ids


def test_engine_tokenizes_like_the_oracle_on_many_texts(engine, tiny, oracle_tokenizer):  # noqa: F811
    for i, t in enumerate(texts(300, 20261204)):
        assert engine_ids(engine, tiny, t) == oracle_tokenizer.encode(t, add_special_tokens=False).ids, (i, t)


def random_codepoints(n: int, seed: int) -> list[bytes]:
    """Texts of random codepoints from every plane (no surrogates, no NUL), UTF-8."""
    rng = random.Random(seed)
    spans = [(1, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    return ["".join(chr(rng.randint(*rng.choice(spans))) for _ in range(rng.randint(1, 30))).encode() for _ in range(n)]


def tokenize_ref(tiny, texts: list[bytes], tmp_path, **env) -> list[str]:  # noqa: F811
    """``llama-tokenize-ref --ids`` of ``texts``: one line of token ids each."""
    path = tmp_path / "texts.bin"
    path.write_bytes(b"".join(t + b"\0" for t in texts))
    out = subprocess.run(
        [str(engine_bin("llama-tokenize-ref")), "--model", str(tiny), "--texts", str(path), "--reps", "1", "--ids"],
        env={**os.environ, **env},
        capture_output=True,
        check=True,
        timeout=300,
    ).stdout.decode()
    lines = out.split("\n")[:-1]
    assert len(lines) == 2 * len(texts)
    return lines[1::2]


def test_patched_tokenizer_equals_stock(tiny, tmp_path):  # noqa: F811
    if not os.access(engine_bin("llama-tokenize-ref"), os.X_OK):
        pytest.skip("llama-tokenize-ref is not built yet (make -C engines all)")
    many = [t.encode() for t in texts(3000, 4)] + random_codepoints(2000, 8)
    many += [b"\xff\xfe12", b"ab\xc3", b"\xe2\x82", b"9\x80 9", b"\xf0\x9f\x99 7"]  # invalid UTF-8
    stock = tokenize_ref(tiny, many, tmp_path, LLAMA_UNICODE_STD_REGEX="1", LLAMA_BPE_NO_WORD_CACHE="1")
    patched = tokenize_ref(tiny, many, tmp_path)
    assert sum(len(line.split()) for line in patched) > 100_000
    assert [i for i, (a, b) in enumerate(zip(stock, patched)) if a != b] == []
