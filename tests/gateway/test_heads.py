"""Trained heads without a model: the fit (numpy) against an independent reading, the served arithmetic
(plain Python) against the fit's, the heads file's refusals, signatures, and the pipeline's use of a head
(a fake engine that answers SCORE with hidden states)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from gateway.decision import heads, schema
from gateway.lab import head_fit


def _data(seed: int = 0, n: int = 240, d: int = 12, k: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(k, d)) * 2
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, k)), axis=1)
    return X, y, [f"r{i // 3}" for i in range(n)]


def test_fit_minimizes_its_objective() -> None:
    """The gradient of the penalized log-loss at the returned point is ~0 (an independent check of the
    optimizer: central differences of the objective, not the code's own gradient)."""
    X, y, _ = _data()
    Z = (X - X.mean(0)) / X.std(0)
    lam = 0.01
    W, b = head_fit.fit_lr(Z, y, 3, lam, iters=3000)

    def objective(W, b):
        z = Z @ W.T + b
        z = z - z.max(1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(1, keepdims=True))
        return -lp[np.arange(len(y)), y].mean() + lam / 2 * (W**2).sum()

    eps = 1e-5
    for i, j in [(0, 0), (1, 5), (2, 11)]:
        Wp, Wm = W.copy(), W.copy()
        Wp[i, j] += eps
        Wm[i, j] -= eps
        assert abs((objective(Wp, b) - objective(Wm, b)) / (2 * eps)) < 1e-6


def test_fit_learns_and_predict_matches_the_served_arithmetic() -> None:
    X, y, ids = _data()
    h = head_fit.fit(X[:180], y[:180], 3, ids[:180])
    P = head_fit.predict(h, X[180:])
    assert (P.argmax(1) == y[180:]).mean() > 0.7  # the labels follow a linear rule with Gumbel noise
    assert h["lam"] in head_fit.LAMBDAS and h["T"] > 0
    doc = {
        "format": heads.FORMAT,
        "model": {"name": "m", "sha256": "ab" * 32},
        "heads": [{"name": "h1", "signature": "s1", "layer": 3, "x_debias": [], **h}],
    }
    head = heads.load_document(doc, "doc").heads["s1"]
    served = np.array([head.predict(list(x)) for x in X[180:]])
    assert np.abs(served - P).max() < 1e-12
    assert all(math.isclose(sum(p), 1.0) for p in served)


def test_needs_two_requests() -> None:
    X, y, _ = _data(n=6)
    with pytest.raises(ValueError, match="at least 2 requests"):
        head_fit.fit(X, y, 3, ["one"] * 6)


def _doc(**over):
    h = {"name": "h", "signature": "s", "layer": 1, "mean": [0.0, 0.0], "scale": [1.0, 1.0]}
    h.update({"W": [[1.0, 0.0], [0.0, 1.0]], "b": [0.0, 0.0], "T": 1.0, "x_debias": []})
    h.update(over)
    return {"format": heads.FORMAT, "model": {"sha256": "00" * 32}, "heads": [h]}


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({"layer": -1}, "doc: heads[0].layer: expected a layer number"),
        ({"scale": [1.0, 0.0]}, "doc: heads[0].scale[1]: expected a number from 1e-06 to 1e+06, got 0.0"),
        ({"scale": [1.0, 1.0, 1.0]}, "doc: heads[0]: mean, scale and each W row"),
        ({"W": [[1.0, 0.0]]}, "doc: heads[0].W: expected one row per option"),
        ({"b": [0.0]}, "doc: heads[0]: mean, scale and each W row"),
        ({"T": 0}, "doc: heads[0].T: expected a positive number"),
        ({"mean": [0.0, float("nan")]}, "doc: heads[0].mean: expected finite numbers"),
        ({"x_debias": "none"}, "doc: heads[0].x_debias: expected a list"),
        # issue 46, item 6: numbers a fit never makes, which made every matching answer a 500 or a certainty
        (
            {"T": 1e-300},
            "doc: heads[0].T: expected a number from 0.04 to 25 (heads fit fits it from 0.05 to 20), got 1e-300",
        ),
        (
            {"W": [[1e300, 0.0], [0.0, 1.0]]},
            "doc: heads[0].W[0][0]: expected a number from -1e+06 to 1e+06, got 1e+300",
        ),
        ({"b": [0.0, -2e6]}, "doc: heads[0].b[1]: expected a number from -1e+06 to 1e+06, got -2000000.0"),
        ({"mean": [1e7, 0.0]}, "doc: heads[0].mean[0]: expected a number from -1e+06 to 1e+06, got 10000000.0"),
        ({"scale": [1.0, 1e-300]}, "doc: heads[0].scale[1]: expected a number from 1e-06 to 1e+06, got 1e-300"),
    ],
)
def test_bad_heads_file(over, msg) -> None:
    with pytest.raises(ValueError, match=re.escape(msg)):
        heads.load_document(_doc(**over), "doc")


@pytest.mark.parametrize(
    ("over", "msg"),
    [
        ({}, "doc: heads[0].mean: 2 values, the served model's hidden state has 576 (CAPS x_hidden_dim)"),
        ({"layer": 30}, "doc: heads[0].layer: 30, the served model has layers 0 to 29 (CAPS x_hidden=30)"),
    ],
)
def test_a_heads_file_is_checked_against_the_engine(over, msg) -> None:
    # issue 46, item 6: a head of another size answered every matching question 500, one of a layer the
    # model lacks made every matching request a 400 that blamed the client
    with pytest.raises(ValueError, match=re.escape(msg)):
        heads.load_document(_doc(**over), "doc", hidden=(30, 576))
    fits = heads.load_document(_doc(**over), "doc", hidden=(31, 2))
    assert fits.names == ["h"]


def test_printable_escapes_what_would_forge_a_log_line() -> None:
    assert heads.printable("dept\n\x1b[31mserveproto: forged\r\u2028é") == (
        "dept\\n\\x1b[31mserveproto: forged\\r\\u2028é"
    )
    assert heads.printable("head-1f0a plain") == "head-1f0a plain"


def test_signature_is_type_instructions_options() -> None:
    def q(**kw):
        body = {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": "bee"}}
        body.update(kw)
        return schema.parse_request({"state": "x", "questions": {"q": body}}).questions[0]

    base = heads.signature(q())
    assert heads.signature(q()) == base
    assert heads.signature(q(instructions="Which one?")) != base
    assert heads.signature(q(criteria={"b": "bee", "a": None})) != base  # another reply order
    assert heads.signature(q(criteria={"a": None, "b": "bees"})) != base
    assert heads.options_of(q()) == ["a", "b: bee"]


def test_x_head_must_be_none() -> None:
    body = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
    assert schema.parse_request({**body, "x_head": "none"}).head == "none"
    with pytest.raises(schema.JevValidationError) as exc:
        schema.parse_request({**body, "x_head": "mine"})
    assert exc.value.errors[0]["loc"] == ["body", "x_head"]
