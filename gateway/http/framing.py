"""Request framing that h11 accepts but RFC 9112 says not to trust: refused before h11 parses the head.

A request whose body length two parsers could read differently is how
requests are smuggled past a proxy: the bytes one of them takes as this
request's body, the other runs as a second request. h11 resolves some of
these cases its own way (``Transfer-Encoding`` wins over ``Content-Length``,
identical ``Content-Length`` values are merged, an ``obs-fold`` line is
joined to the one before). :func:`check_head` refuses them instead: the
server answers 400 and closes the connection, so nothing after such a head
is ever read as a request.
"""

from __future__ import annotations

import re

#: The end of a request head: an empty line (h11 takes ``\n\r?\n`` as one, so this does too).
HEAD_END = re.compile(rb"\n\r?\n")
#: ``Content-Length = 1*DIGIT`` (RFC 9112 section 6.3, RFC 9110 section 8.6).
_CONTENT_LENGTH = re.compile(rb"[0-9]+")


class FramingError(Exception):
    """The request head frames its body in a way that is refused; the message says how and cites the RFC."""


def head_end(buf: bytes, limit: int) -> int:
    """The index just past the empty line that ends the head at the start of ``buf``; -1 when it has
    not arrived within ``limit + 4`` bytes."""
    m = HEAD_END.search(buf, 0, limit + 4)
    return -1 if m is None else m.end()


def check_head(head: bytes) -> None:
    """Refuse a request head (request line, header lines and the empty line; bytes) whose framing is
    not to be trusted. Raises :class:`FramingError`:

    - a line ended by a bare LF (RFC 9112 section 2.2 lets a recipient accept it; one in front of us
      may not, and read the fields differently);
    - a header line that starts with whitespace, ``obs-fold`` (section 5.2);
    - ``Transfer-Encoding`` and ``Content-Length`` together (section 6.1: the server must not keep
      the connection; we refuse the request);
    - ``Transfer-Encoding`` on an HTTP/1.0 request (section 6.1: the framing is faulty);
    - ``Transfer-Encoding`` whose last coding is not ``chunked`` (section 6.3, rule 4);
    - ``Content-Length`` sent more than once, or not one decimal number, as ``4, 4`` (section 6.3,
      rule 5; RFC 9110 section 8.6 lets a recipient merge identical values, we refuse them).
    """
    lines = head.split(b"\n")
    # the split leaves the text after the final LF (empty) last; every line before it ends in LF
    for line in lines[:-1]:
        if not line.endswith(b"\r"):
            raise FramingError(
                "a line of the request head ends in a bare LF: end every line with CRLF (RFC 9112 section 2.2)"
            )
    lines = [line[:-1] for line in lines[:-1]]
    while lines and not lines[0]:
        lines.pop(0)  # empty lines before the request line (h11 refuses them on its own)
    if not lines:
        return
    request_line, fields = lines[0], [line for line in lines[1:] if line]
    version = request_line.rsplit(b" ", 1)[-1]
    transfer_encoding: list[bytes] = []
    content_length: list[bytes] = []
    for line in fields:
        if line[:1] in (b" ", b"\t"):
            raise FramingError(
                "a header line starts with whitespace (obs-fold): send each field on one line (RFC 9112 section 5.2)"
            )
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"transfer-encoding":
            transfer_encoding.append(value.strip(b" \t"))
        elif name == b"content-length":
            content_length.append(value.strip(b" \t"))
    if transfer_encoding and content_length:
        raise FramingError(
            "Transfer-Encoding and Content-Length together: the body's length is ambiguous; "
            "send one of them (RFC 9112 section 6.1)"
        )
    if transfer_encoding:
        if version == b"HTTP/1.0":
            raise FramingError(
                "Transfer-Encoding on an HTTP/1.0 request: its framing cannot be trusted; "
                "send Content-Length (RFC 9112 section 6.1)"
            )
        codings = [c.strip(b" \t").lower() for c in b",".join(transfer_encoding).split(b",")]
        if codings[-1] != b"chunked":
            shown = b", ".join(transfer_encoding).decode("latin-1")
            raise FramingError(
                f"Transfer-Encoding {shown!r} does not end in chunked: the body's length cannot be "
                "determined (RFC 9112 section 6.3)"
            )
    if len(content_length) > 1:
        raise FramingError(f"Content-Length sent {len(content_length)} times: send it once (RFC 9112 section 6.3)")
    if content_length and not _CONTENT_LENGTH.fullmatch(content_length[0]):
        shown = content_length[0].decode("latin-1")
        raise FramingError(f"Content-Length {shown!r} is not one decimal number (RFC 9112 section 6.3)")
