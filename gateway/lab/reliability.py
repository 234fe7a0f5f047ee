"""Reliability diagrams of a calibration's answers: in text and as a PNG (matplotlib).

Accuracy against confidence per equal-mass bin (:func:`gateway.lab.evaluation.bins`), what
``serveproto calibrate`` prints and draws before and after its fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gateway.lab import evaluation


def reliability_text(probs: Sequence[Sequence[float]], gold: Sequence[int], n_bins: int = 10, width: int = 40) -> str:
    """A reliability diagram in text: per equal-mass bin (:func:`gateway.lab.evaluation.bins`), mean
    confidence, accuracy and a bar."""
    import numpy as np

    conf, correct = evaluation.confidences(probs, gold)
    b = evaluation.bins(conf, np.ones(len(conf)), n_bins)
    lines = ["confidence  accuracy  n     (| = confidence, # = accuracy)"]
    for k in range(n_bins):
        chunk = b == k
        if not chunk.any():
            continue
        c, a = float(conf[chunk].mean()), float(correct[chunk].mean())
        bar = [" "] * (width + 1)
        for x in range(int(round(a * width)) + 1):  # noqa: RUF046  (kept as written)
            bar[x] = "#"
        bar[int(round(c * width))] = "|"  # noqa: RUF046  (kept as written)
        lines.append(f"{c:10.3f}  {a:8.3f}  {int(chunk.sum()):<4}  {''.join(bar)}")
    return "\n".join(lines)


def reliability_png(
    before: tuple[Sequence[Sequence[float]], Sequence[int]],
    after: tuple[Sequence[Sequence[float]], Sequence[int]],
    path: str | Path,
    title: str,
    n_bins: int = 10,
) -> None:
    """A reliability diagram (matplotlib): accuracy against confidence per equal-mass bin, before and
    after, with the diagonal. ``before``/``after``: (probabilities, gold). Raises ``ImportError``
    without matplotlib (``pip install 'serveproto[calibrate]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for (probs, gold), label, marker in ((before, "before", "o"), (after, "after", "s")):
        conf, correct = evaluation.confidences(probs, gold)
        b = evaluation.bins(conf, np.ones(len(conf)), n_bins)
        xs, ys = [], []
        for k in range(n_bins):
            if (b == k).any():
                xs.append(float(conf[b == k].mean()))
                ys.append(float(correct[b == k].mean()))
        e = evaluation.ece(conf, correct, n_bins=n_bins)
        ax.plot(xs, ys, marker=marker, label=f"{label} (ECE {e:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (top answer's probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
