"""serveproto-sparrow against its own package (issue 47): the token ids of sparrow-decider's
WordPiece, and on generated requests (every type, key-value states, JSON states, long states,
255 options, unicode) the probabilities its Decider computes (``Decider.ask`` before it rounds to
4 digits: ``Decider.probs``), within 1e-6. The digits are not bit-equal where numpy's OpenBLAS
sums a matrix product in its kernel's order (the engine sums in double and rounds once);
every other operation is numpy's float32 operation in numpy's order (engines/sparrow/model.h).

The package is the wheel the engine's model comes from, imported from the cache
(gateway/engine/sparrow_model.py fetches it as the default model is fetched)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gateway.decision import record
from gateway.decision.schema import parse_request
from gateway.engine import sparrow_model

ENGINE = Path(__file__).resolve().parents[2] / "engines" / "bin" / "serveproto-sparrow"

pytestmark = [pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def package():
    wheel = sparrow_model.wheel(quiet=True)
    if str(wheel) not in sys.path:
        sys.path.insert(0, str(wheel))  # a pure-Python wheel imports from its zip
    import sparrow_decider

    return sparrow_decider


@pytest.fixture(scope="module", params=sorted(sparrow_model.MODELS))
def model(request, package):
    src = sparrow_model.sparrow_file(request.param, quiet=True)
    return request.param, package.Decider.load(str(src)), sparrow_model.ensure(request.param, quiet=True)


WORDS = (
    "battery low charge robot kitchen dirt level zone obstacle near far refund billing invoice angry urgent "
    "please help the a of to is Café naïve ÉCOLE Straße ΟΔΟΣ σοφία İstanbul 東京タワー 한국어 Ⅻ ½ 🙂 ǅ ﬁne "
    "don't e-mail x=5 (note) [tag] {brace} résumé ١٢٣ \u00a0 \u2028 \t"
).split(" ")


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _kv_text(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 20)):
        key = rng.choice(["battery", "dirt_level", "zone_a", "obstacle distance", "temp", "speed-max"])
        sep = rng.choice([": ", "=", " : ", ":"])
        val = rng.choice([str(rng.randint(-50, 150)), f"{rng.uniform(-2, 2):.3f}", "١٢", "0.5"])
        pre = rng.choice(["", "zone_b: ", "robot ", "  "])
        lines.append(f"{pre}{key}{sep}{val}{rng.choice(['', '%', ' %'])} {_text(rng, 0, 3)}")
    return rng.choice(["\n", "\r\n", "\u2028"]).join(lines)


def _state(rng: random.Random, i: int):
    form = i % 6
    if form == 0:
        return _text(rng, 1, 30)
    if form == 1:
        return _kv_text(rng)
    if form == 2:  # past max_len (512 tokens)
        return _text(rng, 400, 1500)
    if form == 3:
        return {"status": _kv_text(rng), "z": [1, 2.5, None, True], "a": {"battery": rng.randint(0, 100)}}
    if form == 4:
        return [_text(rng, 1, 5), {"user": _text(rng, 1, 10), "n": rng.randint(0, 9)}, [], {}]
    return "  " + _text(rng, 1, 10) + " \n"


def _question(rng: random.Random, i: int) -> dict:
    kind = ("noul", "choice", "score")[i % 3]
    q: dict = {"type": kind}
    if rng.random() < 0.8:
        q["instructions"] = _text(rng, 1, 12)
    if kind == "noul":
        crit = {}
        if rng.random() < 0.5:
            crit["true"] = _text(rng, 0, 6)
        if rng.random() < 0.3:
            crit["false"] = rng.choice([_text(rng, 1, 6), "", None])
        if crit or rng.random() < 0.5:
            q["criteria"] = crit
    elif kind == "choice":
        n = 255 if i % 17 == 0 else rng.randint(2, 12)
        q["criteria"] = {
            f"{rng.choice(WORDS).strip() or 'x'}_{k}": rng.choice([_text(rng, 0, 8), None, {"k": _text(rng, 1, 3)}])
            for k in range(n)
        }
    else:
        q["criteria"] = [_text(rng, 1, 5) for _ in range(rng.randint(2, 10))]
    return q


def _decide(spdm: Path, payloads: list[bytes]) -> list[dict]:
    frames = b"".join(b"DECIDE %d 0 %d\n%s\n" % (i + 1, len(p), p) for i, p in enumerate(payloads))
    out = subprocess.run([str(ENGINE), "--model", str(spdm)], input=frames, capture_output=True, timeout=300).stdout
    answers, at = [], 0
    while at < len(out):
        end = out.index(b"\n", at)
        line = out[at:end].split(b" ")
        at = end + 1
        if line[0] == b"DECISION":
            n = int(line[2])
            answers.append(json.loads(out[at : at + n]))
            at += n + 1
        elif line[0] == b"ERROR":
            raise AssertionError(out[at - len(b" ".join(line)) - 1 : end].decode())
    return answers


def test_token_ids_equal_the_package(model):
    _name, decider, spdm = model
    rng = random.Random(47)
    texts = [_text(rng, 1, 80) for _ in range(60)] + [_kv_text(rng) for _ in range(20)]
    texts += ["ΑΣ ΟΔΟΣ. ΣΑ Σ", "a" * 101 + " b" * 3, "İstanbul ﬁne Ǆ", "\x00\ufffd\x07ok\u200b", _text(rng, 900, 1000)]
    tok = decider.static.tok
    for text in texts:
        got = subprocess.run(
            [str(ENGINE), "--model", str(spdm), "--tokenize"], input=text.encode(), capture_output=True, check=True
        ).stdout.split()
        assert [int(x) for x in got] == tok.encode(text, decider.static.max_len), text[:80]


def test_probabilities_equal_the_package(model, package):
    name, decider, spdm = model
    rng = random.Random(470)
    bodies, payloads = [], []
    for i in range(120):
        body = {
            "state": _state(rng, i),
            "questions": {f"q{k}": _question(rng, i + k) for k in range(rng.randint(1, 4))},
        }
        if i == 7:
            body["questions"] = {f"q{k}": _question(rng, k) for k in range(64)}
        req = parse_request(body)
        payloads.append(record.serialize(record.build(req, raw=True, sort_keys=False)))
        bodies.append(body)
    answers = _decide(spdm, payloads)
    assert len(answers) == len(bodies)
    worst, bit_equal, n = 0.0, 0, 0
    for body, ans in zip(bodies, answers):
        assert [a["id"] for a in ans["answers"]] == list(body["questions"])
        for a, q in zip(ans["answers"], body["questions"].values()):
            kind, opts = package._options(q)
            want = decider.static.probs(body["state"], q.get("instructions"), kind, opts)
            got = np.array(a["probs"], np.float32)
            assert got.shape == want.shape
            worst = max(worst, float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()))
            bit_equal += bool((got == want).all())
            n += 1
            assert a["temperature"] == decider.temps[kind]
    print(f"{name}: {n} questions, worst |engine - package| {worst:.3g}, bit-equal {bit_equal}")
    assert n >= 200
    assert worst <= 1e-6
