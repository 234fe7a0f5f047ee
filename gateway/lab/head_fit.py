"""Fitting a head (:mod:`gateway.decision.heads`) from labelled hidden states, with numpy.

:func:`fit` standardizes the states (per coordinate: mean, standard deviation), fits a
multinomial logistic regression with an L2 (ridge) penalty on ``W``::

    minimize   mean_i -log softmax(W z_i + b)[y_i]  +  lam / 2 * ||W||_F^2

by Nesterov-accelerated gradient descent with the step ``1 / L``,
``L = sigma_max(Z)^2 / (2 n) + lam`` (the softmax cross-entropy's Hessian is at most half
the identity in the logits; Nesterov 1983), picks ``lam`` from :data:`LAMBDAS` by the
held-out log-loss of ``folds``-fold cross-validation *by request* (no request's questions
on both sides), then fits a temperature ``T`` on the out-of-fold logits of the chosen
``lam`` (Guo et al. 2017, temperature scaling) and refits on everything.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LAMBDAS", "fit", "predict", "fit_lr"]

#: The ridge strengths tried (per-sample loss scale; standardized inputs).
LAMBDAS = (1e-3, 1e-2, 3e-2, 1e-1, 1.0)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out


def fit_lr(Z: np.ndarray, y: np.ndarray, k: int, lam: float, iters: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """``(W (k, d), b (k,))`` minimizing the module doc's objective on standardized ``Z (n, d)``,
    labels ``y (n,)`` in ``0..k-1``."""
    n, d = Z.shape
    Y = np.zeros((n, k))
    Y[np.arange(n), y] = 1.0
    L = float(np.linalg.norm(Z, 2)) ** 2 / (2 * n) + lam + 0.5  # + 0.5: the bias column
    step = 1.0 / L
    W = np.zeros((k, d))
    b = np.zeros(k)
    Wv, bv = W.copy(), b.copy()
    t = 1.0
    for _ in range(iters):
        G = (_softmax(Z @ Wv.T + bv) - Y) / n
        W1 = Wv - step * (G.T @ Z + lam * Wv)
        b1 = bv - step * G.sum(axis=0)
        t1 = (1 + math.sqrt(1 + 4 * t * t)) / 2
        Wv = W1 + (t - 1) / t1 * (W1 - W)
        bv = b1 + (t - 1) / t1 * (b1 - b)
        W, b, t = W1, b1, t1
    return W, b


def _folds(groups: Sequence[str], k: int, seed: int) -> np.ndarray:
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    of = {g: i % k for i, g in enumerate(names)}
    return np.array([of[g] for g in groups])


def _nll(logits: np.ndarray, y: np.ndarray, T: float) -> float:
    P = _softmax(logits / T)
    return float(-np.mean(np.log(np.clip(P[np.arange(len(y)), y], 1e-12, 1.0))))


def _fit_T(logits: np.ndarray, y: np.ndarray) -> float:
    """The temperature minimizing the log-loss of ``logits``, golden-section search on log T in [-3, 3]."""
    lo, hi = -3.0, 3.0
    g = (math.sqrt(5) - 1) / 2
    a, c = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fc = _nll(logits, y, math.exp(a)), _nll(logits, y, math.exp(c))
    for _ in range(60):
        if fa < fc:
            hi, c, fc = c, a, fa
            a = hi - g * (hi - lo)
            fa = _nll(logits, y, math.exp(a))
        else:
            lo, a, fa = a, c, fc
            c = lo + g * (hi - lo)
            fc = _nll(logits, y, math.exp(c))
    return math.exp((lo + hi) / 2)


def fit(X: np.ndarray, y: np.ndarray, k: int, groups: Sequence[str], folds: int = 3, seed: int = 0) -> dict[str, Any]:
    """A head's numbers from hidden states ``X (n, d)``, gold ``y (n,)`` (``0..k-1``) and each row's
    request id (``groups``): ``{"mean", "scale", "W", "b", "T", "lam", "cv_nll"}`` as lists / floats
    (the heads file's fields, :mod:`gateway.decision.heads`). ValueError for fewer than 2 requests."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[scale < 1e-6] = 1.0
    Z = (X - mean) / scale
    n_groups = len(set(groups))
    if n_groups < 2:
        raise ValueError("a head needs labels from at least 2 requests")
    f = _folds(groups, min(folds, n_groups), seed)
    best = None
    for lam in LAMBDAS:
        logits = np.zeros((len(y), k))
        for j in range(f.max() + 1):
            tr, te = f != j, f == j
            W, b = fit_lr(Z[tr], y[tr], k, lam)
            logits[te] = Z[te] @ W.T + b
        T = _fit_T(logits, y)
        nll = _nll(logits, y, T)
        if best is None or nll < best[0]:
            best = (nll, lam, T)
    assert best is not None
    nll, lam, T = best
    W, b = fit_lr(Z, y, k, lam)
    return {
        "mean": mean.tolist(),
        "scale": scale.tolist(),
        "W": W.tolist(),
        "b": b.tolist(),
        "T": T,
        "lam": lam,
        "cv_nll": nll,
    }


def predict(head: dict[str, Any], X: np.ndarray) -> np.ndarray:
    """Probabilities ``(n, k)`` of a :func:`fit` result on hidden states ``X (n, d)`` (the
    arithmetic of :meth:`gateway.decision.heads.Head.predict`, vectorized)."""
    Z = (np.asarray(X, dtype=np.float64) - np.array(head["mean"])) / np.array(head["scale"])
    return _softmax((Z @ np.array(head["W"]).T + np.array(head["b"])) / head["T"])
