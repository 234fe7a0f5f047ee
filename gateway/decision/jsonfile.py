"""A JSON document read whole from a file of bounded size (calibration and heads files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

__all__ = ["read_document"]


def read_document(path: str | Path, max_bytes: int, what: str) -> Any:
    """The parsed JSON of the file ``path``. Raises ``ValueError`` naming the file when it is larger
    than ``max_bytes`` ("more than a <what> file holds") or not JSON; ``OSError`` as reading does."""
    p = Path(path)
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path}: {size} bytes, more than a {what} file holds ({max_bytes} at most)")
    try:
        return orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
