"""SCORE's spliced tokenization (engines/llama/splice.c) against whole-text tokenization.

Spec 9.1 scores the tokens of the whole text ``prefix + stem + option``. The
engine tokenizes the prefix once and each continuation only from a cut near
the prefix's end. ``--splice-check`` makes it tokenize every continuation
whole as well (llama.cpp's own tokenization of the concatenated text, the
spec's definition) and report, on exit, how many were spliced, how many went
whole, and how many splices differed. The texts here are built to break a
careless splice: continuations inside words, runs of spaces, newlines, ChatML
control tokens, digits, UTF-8 multibyte characters on both sides of the
boundary.
"""

from __future__ import annotations

import random
import re

from serveproto import Done, Error, Scored
from test_llama_engine import Engine, score, tiny  # noqa: F401  (tiny is a fixture)

#: Pieces the random texts are glued from (no leading space: glue picks one).
WORDS = [
    "the",
    "weather",
    "is",
    "calm",
    "raining",
    "Answer",
    "yes",
    "no",
    "maybe",
    "internationalization",
    "don't",
    "it's",
    "12345",
    "3.14",
    "1,000",
    "e-mail",
    "x",
    "A",
    "café",
    "naïve",
    "日本語",
    "テキスト",
    "🙂",
    "👍🏽",
    "ß",
    "Привет",
    "(paren)",
    "[tag]",
    "...",
    "?!",
    "#",
    "--",
    "''",
    '"quoted"',
]
GLUE = [
    " ",
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n",
    "",
    ". ",
    ", ",
    ":\n",
    "<|im_end|>\n<|im_start|>user\n",
    "<|im_start|>assistant\n",
    "<|im_end|>",
]


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(GLUE) + rng.choice(WORDS) for _ in range(n))


def continuation(rng: random.Random) -> str:
    """A stem or option: starts mid-word, with a space, a newline, a control token or a multibyte char."""
    head = rng.choice(["", "", " ", "  ", "\n", "<|im_end|>", "é", "語", "🙂", "ing", "s", "0"])
    return head + text(rng, rng.randint(0, 3)) if head else rng.choice(WORDS) + text(rng, rng.randint(0, 2))


def prefixes(rng: random.Random) -> list[str]:
    """Random texts, plus prefixes that end on each kind of boundary."""
    out = [text(rng, rng.randint(20, 120)) for _ in range(24)]
    body = text(random.Random(7), 80)
    for end in [
        "",
        " ",
        "  ",
        "\n",
        "\n\n",
        "inter",
        "naï",
        "日本",
        "123",
        "<|im_start|>",
        "<|im_start|>user\n",
        "🙂",
        " é",
        "'",
    ]:
        out.append(body + end)
    out.append("<|im_start|>system\nYou answer.<|im_end|>\n<|im_start|>user\n" + body + "<|im_end|>\n")
    out.append("日本語のテキスト" * 30)  # no ASCII space at all: no cut, tokenized whole
    out.append("short")  # too few tokens for a cut
    return out


def shut_down(eng: Engine) -> tuple[int, str]:
    """Closes the engine's stdin; its exit status and its whole stderr."""
    eng.proc.stdin.close()
    rc = eng.proc.wait(120)
    err = eng.stderr_text()
    eng.close()
    return rc, err


def splice_stats(stderr: str) -> dict[str, int]:
    m = re.search(r"splice check: (\d+) spliced, (\d+) whole, (\d+) mismatched, (\d+) from a stem's cut", stderr)
    assert m, stderr[-2000:]
    return {"spliced": int(m[1]), "whole": int(m[2]), "mismatched": int(m[3]), "stem": int(m[4])}


def test_spliced_tokenization_equals_whole_text_on_many_texts(tiny):  # noqa: F811
    rng = random.Random(20261130)
    eng = Engine(tiny, "--splice-check", "--ctx", "4096")
    n_texts = 0
    try:
        for rid, prefix in enumerate(prefixes(rng), start=1):
            groups = []
            for _ in range(4):
                stem = continuation(rng)
                opts = sorted({continuation(rng) for _ in range(3)} - {""})
                groups.append({"stem": stem, "options": opts})
                n_texts += 1 + len(opts)
            ev = score(eng, rid, {"prefix": prefix, "groups": groups})
            assert isinstance(ev[-1], Done), (prefix[-40:], groups, ev[-1])
            assert len([e for e in ev if isinstance(e, Scored)]) == sum(len(g["options"]) for g in groups)
        # the same prefix again comes from the kept tokens and answers the same
        again = score(
            eng,
            999,
            {
                "prefix": prefixes(random.Random(20261130))[0],
                "groups": [{"stem": " Is it?", "options": [" yes", " no"]}],
            },
        )
        assert isinstance(again[-1], Done)
        n_texts += 3
    finally:
        rc, stderr = shut_down(eng)
    assert rc == 0, stderr[-2000:]
    stats = splice_stats(stderr)
    assert stats["mismatched"] == 0, stderr[-4000:]
    assert stats["spliced"] + stats["whole"] == n_texts
    # most texts take the splice; the CJK-only and the 1-token prefixes cannot
    assert stats["spliced"] > 0.8 * n_texts, stats
    assert stats["whole"] >= 2 * 4, stats
    # options of long-enough stems start from the stem's own cut
    assert stats["stem"] > 0.4 * n_texts, stats


def test_options_of_a_long_stem_are_tokenized_from_the_stems_cut(tiny):  # noqa: F811
    """Questions as the gateway writes them (ChatML turns, an instruction, numbers), options that start
    mid-word, with spaces, newlines, digits, control tokens: every option from its stem's cut, none
    differing from the whole text."""
    rng = random.Random(20261204)
    eng = Engine(tiny, "--splice-check", "--ctx", "4096")
    n_options = 0
    try:
        for rid in range(1, 9):
            groups = []
            for q in range(4):
                stem = (
                    f"<|im_end|>\n<|im_start|>user\nQuestion {rid}{q}. {text(rng, rng.randint(8, 30))}"
                    "<|im_end|>\n<|im_start|>assistant\n" + rng.choice(["", "Answer:", " ", "12"])
                )
                opts = sorted({continuation(rng) for _ in range(6)} - {""})
                groups.append({"stem": stem, "options": opts})
                n_options += len(opts)
            ev = score(eng, rid, {"prefix": text(rng, 60), "groups": groups})
            assert isinstance(ev[-1], Done), ev[-1]
    finally:
        rc, stderr = shut_down(eng)
    assert rc == 0, stderr[-2000:]
    stats = splice_stats(stderr)
    assert stats["mismatched"] == 0, stderr[-4000:]
    assert stats["stem"] == n_options, stats


def test_splice_needs_no_check_flag_and_scores_like_the_checked_engine(tiny):  # noqa: F811
    """The same SCOREs with and without --splice-check give the same frames."""
    rng = random.Random(5)
    job = {
        "prefix": text(rng, 200) + "\nQuestion:",
        "groups": [{"stem": continuation(rng), "options": [" yes", " no", "maybe"]} for _ in range(6)],
    }
    plain, checked = Engine(tiny), Engine(tiny, "--splice-check")
    try:
        a, b = score(plain, 1, job), score(checked, 1, job)
        assert not isinstance(a[-1], Error), a[-1]
        assert [(s.group, s.option, s.context_tokens, s.logprobs) for s in a if isinstance(s, Scored)] == [
            (s.group, s.option, s.context_tokens, s.logprobs) for s in b if isinstance(s, Scored)
        ]
    finally:
        plain.close()
        checked.close()
