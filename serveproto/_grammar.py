"""The productions of the serve protocol, written once, as data.

Each rule cites its section of ``spec/serve-protocol.md``. The readers use the
fast checks (``bytes.isdigit`` and friends) on the hot path; the compiled
patterns here are the definition those checks implement, and are used where
speed does not matter.
"""

from __future__ import annotations

import re

# --- section 1: framing ----------------------------------------------------
#: Longest line, in bytes, ``\n`` included (configurable per connection).
MAX_LINE = 4096
#: Largest payload, in bytes, by default (configurable per connection).
MAX_PAYLOAD = 64 << 20
#: ``kind = [A-Z][A-Z0-9_]*``
KIND_RE = re.compile(rb"[A-Z][A-Z0-9_]*")
#: ``uint = 0|[1-9][0-9]*``, at most 20 digits, below 2**64.
UINT_RE = re.compile(rb"0|[1-9][0-9]{0,19}")
UINT_LIMIT = 1 << 64
#: ``float = -?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)`` (as read).
FLOAT_RE = re.compile(rb"-?(?:inf|nan|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)")
#: ``key = [a-z_][a-z0-9_]*``; a ``key=value`` field splits at the first ``=``.
KEY_RE = re.compile(rb"[a-z_][a-z0-9_]*")
#: A ``value`` of a ``key=value`` field: one or more bytes, no space (no ``\n``).
VALUE_RE = re.compile(rb"[^ \n]+")
#: Free text to the end of a line (ERROR reasons, LOAD_FAIL details).
TEXT_RE = re.compile(r"[^\n]*")
#: A token of text with no space (CAPS values, ERROR codes).
WORD_RE = re.compile(r"[^ \n]+")
#: The ``ids=1`` payload (section 4): token ids, ASCII decimal, single spaces.
IDS_PAYLOAD_RE = re.compile(rb"(?:0|[1-9][0-9]{0,19})(?: (?:0|[1-9][0-9]{0,19}))*")

# --- section 3: handshake ----------------------------------------------------
#: The READY sentinel line, without its ``\n``.
READY_LINE = b"\x01\x01READY\x01\x01"
#: ``LOAD_FAIL kind=<kind>``
LOAD_FAIL_KINDS = frozenset({"nomem", "io", "format", "unsupported"})
#: CAPS keys whose value is ``0`` or ``1``, with the meaning of an absent key.
CAPS_BOOL_KEYS = {
    "chat": True,
    "decide": False,
    "vision": False,
    "x_score": False,
    "x_score_base": False,
    "x_counters": False,
    "x_health": False,
}
#: CAPS keys whose value is a ``uint``.
CAPS_UINT_KEYS = frozenset({"slots", "n_ctx", "n_vocab", "pin_slots", "max_logprobs", "x_hidden", "x_hidden_dim"})
#: STAT carries exactly four floats; the last is the resident memory in GB.
STAT_FIELDS = 4

# --- section 4: requests ------------------------------------------------------
#: SUBMIT: ``SUBMIT <id> <slot> <bytes> <max_tokens> <temp> <top_p>`` = 7 fields.
SUBMIT_FIXED_FIELDS = 7
#: SUBMIT keys and their inclusive ranges; written in this order (spec/vectors/README.md).
SUBMIT_KEYS = {b"logprobs": (0, 32), b"pin": (0, 1), b"ids": (0, 1), b"counters": (0, 1)}
MAX_LOGPROBS = 32
#: Request kinds that carry a payload, and the index of the byte count field
#: in the line split on spaces (the kind is index 0). SUBMIT's optional
#: ``gbytes`` is index 7 when that field is a bare uint.
REQUEST_PAYLOAD_FIELD = {b"SUBMIT": 3, b"IMAGE": 2, b"DECIDE": 3, b"SCORE": 3}
SUBMIT_GBYTES_FIELD = 7
#: Every request kind of sections 4 and 9, with the CAPS key that must have
#: been advertised for an engine to know it (``None``: always known).
REQUEST_KINDS = {
    b"SUBMIT": None,
    b"IMAGE": None,
    b"STOP": None,
    b"CANCEL": None,
    b"DECIDE": None,
    b"SCORE": "x_score",
    b"PING": "x_health",
}

# --- section 5: replies -------------------------------------------------------
#: Reply kinds that carry a payload, and the index of their byte count field.
REPLY_PAYLOAD_FIELD = {b"ECHO": 2, b"DATA": 2, b"DECISION": 2, b"HIDDEN": 2}
#: Every line kind a gateway knows (sections 3, 5, 9); others are telemetry.
REPLY_KINDS = frozenset(
    {
        *(b"CAPS", b"STAT", b"LOAD_FAIL", b"ACCEPT", b"ECHO", b"DATA", b"DECISION", b"DONE", b"ERROR"),
        *(b"SCORED", b"HIDDEN", b"PONG"),
    }
)
#: DONE: ``DONE <id> STAT`` + six fields = 9 fields before any key.
DONE_FIXED_FIELDS = 9
#: DONE counters (section 9.2), in their written order.
DONE_COUNTER_KEYS = (b"computed", b"reused", b"snapshot")
SNAPSHOT_VALUES = frozenset({"none", "hit", "stale"})
#: SCORED: at least 1 and at most this many scored tokens per option (9.1).
MAX_SCORED_TOKENS = 200
#: HIDDEN: at most this many values (one layer's output at a context end, 9.1).
MAX_HIDDEN_VALUES = 65536

# --- section 7: error codes -----------------------------------------------------
ERROR_CODES = frozenset(
    {
        "BAD_FRAME",
        "BAD_REQUEST",
        "SLOT_BUSY",
        "DUPLICATE_ID",
        "EMPTY_PROMPT",
        "NOT_FOUND",
        "CANCELLED",
        "DECIDE_INVALID",
        "DECIDE_FAILED",
        "NOT_SUPPORTED",
    }
)

# --- fast path (not a production: a conservative acceptor) ---------------------------------------
#: An ``ECHO`` line with ``k=1`` whose every field is in its plainest form:
#: uints below 10**19, floats with at most 20 integer digits and a two-digit
#: exponent as ``%.9g`` writes it (so always finite). A line this matches is valid by section 1 and
#: 5; a line it does not match takes the general path, which decides.
_FU = rb"(0|[1-9][0-9]{0,18})"
_FF = rb"(-?[0-9]{1,20}(?:\.[0-9]*)?(?:e[-+][0-9][0-9])?)"
ECHO_K1_FAST = re.compile(rb"ECHO ([1-9][0-9]{0,18}) " + _FU + b" " + _FU + b" " + _FF + b" 1 " + _FU + b" " + _FF)
#: The same for ``k`` from 2 to 32: the alternatives come as one group, split by the reader
#: (valid once the group holds exactly k pairs).
_FF0 = rb"-?[0-9]{1,20}(?:\.[0-9]*)?(?:e[-+][0-9][0-9])?"
ECHO_KN_FAST = re.compile(
    rb"ECHO ([1-9][0-9]{0,18}) "
    + _FU
    + b" "
    + _FU
    + b" "
    + _FF
    + rb" ([2-9]|[12][0-9]|3[0-2])((?: (?:0|[1-9][0-9]{0,18}) "
    + _FF0
    + rb"){2,32})"
)
