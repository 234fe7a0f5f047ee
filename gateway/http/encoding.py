"""Request bodies sent with ``Content-Encoding``: decoded with a bound on the output.

A compressed body is small on the wire and can be large decoded (a "zip
bomb"); every decoder here stops at ``limit + 1`` output bytes so the caller
can answer 413 without ever holding more than that.
"""

from __future__ import annotations

import io
import zlib

import zstandard

from gateway.http.message import HTTPError

#: Encodings we decode, as sent in ``Content-Encoding``.
SUPPORTED = ("identity", "gzip", "x-gzip", "deflate", "zstd")


def _too_large(limit: int) -> HTTPError:
    return HTTPError(413, "request_too_large", f"the decoded request body is over {limit} bytes")


def _zlib(data: bytes, limit: int, wbits: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise _too_large(limit)
    out += d.flush()
    if len(out) > limit:
        raise _too_large(limit)
    if not d.eof:
        raise zlib.error("truncated stream")
    return out


def _zstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    out = reader.read(limit + 1)
    if len(out) > limit:
        raise _too_large(limit)
    return out


def decode_body(data: bytes, content_encoding: str | None, limit: int) -> bytes:
    """Decode ``data`` per ``content_encoding`` (a header value, possibly a comma list).

    Returns the decoded bytes, at most ``limit`` long. Raises
    :class:`HTTPError` 415 ``unsupported_media_type`` for an encoding not in
    :data:`SUPPORTED`, 400 ``invalid_request_error`` for a corrupt stream, 413
    ``request_too_large`` when the output would exceed ``limit`` bytes.
    Encodings listed in order were applied in order, so they are undone in
    reverse (RFC 9110 section 8.4).
    """
    if not content_encoding:
        return data
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding not in SUPPORTED:
            raise HTTPError(
                415,
                "unsupported_media_type",
                f"Content-Encoding {coding!r} is not supported (use one of {', '.join(SUPPORTED)})",
            )
        try:
            if coding in ("gzip", "x-gzip"):
                data = _zlib(data, limit, 16 + zlib.MAX_WBITS)
            elif coding == "deflate":
                data = _zlib(data, limit, zlib.MAX_WBITS)
            elif coding == "zstd":
                data = _zstd(data, limit)
        except (zlib.error, zstandard.ZstdError) as exc:
            raise HTTPError(400, "invalid_request_error", f"the request body is not valid {coding}: {exc}") from None
    return data
