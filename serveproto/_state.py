"""The state machines: the connection's handshake and each request's replies.

Both are transition tables keyed by (state, event class). The connection
goes WAIT_READY -> WAIT_CAPS -> WAIT_STAT -> SERVING (spec section 3); a
request goes NEW -> ACCEPTED -> ECHOING -> GENERATING (or DECIDED, SCORING)
and ends at DONE or ERROR (section 5). ``RequestState.check`` also enforces
the counting invariants of section 5 and 9. Both roles use the same tables:
the gateway checks what it receives, the engine what it sends.
"""

from __future__ import annotations

from . import _events as ev
from ._util import Sentinel


# --- public connection states ---------------------------------------------------------------
class HANDSHAKE(Sentinel, metaclass=Sentinel):
    """The engine has not finished READY [CAPS] STAT (section 3)."""


class SERVING(Sentinel, metaclass=Sentinel):
    """The handshake is done; requests and replies flow."""


class CLOSED(Sentinel, metaclass=Sentinel):
    """The peer closed its end (EOF), or the engine reported LOAD_FAIL."""


class ERROR(Sentinel, metaclass=Sentinel):
    """A protocol error ended the connection (gateway side)."""


class NEED_DATA(Sentinel, metaclass=Sentinel):
    """next_event() needs more bytes: call receive_data() first."""


# --- handshake steps (section 3) --------------------------------------------------------------
class WAIT_READY(Sentinel, metaclass=Sentinel):
    """Handshake: nothing received yet."""


class WAIT_CAPS(Sentinel, metaclass=Sentinel):
    """Handshake: READY received; CAPS or STAT next."""


class WAIT_STAT(Sentinel, metaclass=Sentinel):
    """Handshake: CAPS received; STAT next."""


class LOAD_FAILED(Sentinel, metaclass=Sentinel):
    """Handshake: LOAD_FAIL received; the engine exits."""


#: A connection's handshake step -> the step an event of that class moves it to.
HANDSHAKE_TRANSITIONS: dict[tuple[type[Sentinel], type[ev.Event]], type[Sentinel]] = {
    (WAIT_READY, ev.Ready): WAIT_CAPS,
    (WAIT_READY, ev.LoadFail): LOAD_FAILED,
    (WAIT_CAPS, ev.Caps): WAIT_STAT,
    (WAIT_CAPS, ev.Stat): SERVING,
    (WAIT_STAT, ev.Stat): SERVING,
}
HANDSHAKE_EVENTS: frozenset[type[ev.Event]] = frozenset({ev.Ready, ev.Caps, ev.Stat, ev.LoadFail})


# --- per-request phases (section 5) -----------------------------------------------------------
class NEW(Sentinel, metaclass=Sentinel):
    """Request: sent, no reply yet."""


class ACCEPTED(Sentinel, metaclass=Sentinel):
    """Request: ACCEPT received."""


class ECHOING(Sentinel, metaclass=Sentinel):
    """Request: ECHO frames are coming (read-out)."""


class GENERATING(Sentinel, metaclass=Sentinel):
    """Request: DATA frames are coming."""


class DECIDED(Sentinel, metaclass=Sentinel):
    """Request: the DECISION came; DONE next."""


class SCORING(Sentinel, metaclass=Sentinel):
    """Request: SCORED frames are coming."""


#: A request's phase -> the phase a reply of that class moves it to.
REQUEST_TRANSITIONS: dict[tuple[type[Sentinel], type[ev.Event]], type[Sentinel]] = {
    (NEW, ev.Accept): ACCEPTED,
    (NEW, ev.Echo): ECHOING,
    (ACCEPTED, ev.Echo): ECHOING,
    (ECHOING, ev.Echo): ECHOING,
    (NEW, ev.Data): GENERATING,
    (ACCEPTED, ev.Data): GENERATING,
    (ECHOING, ev.Data): GENERATING,
    (GENERATING, ev.Data): GENERATING,
    (NEW, ev.Decision): DECIDED,
    (ACCEPTED, ev.Decision): DECIDED,
    (NEW, ev.Scored): SCORING,
    (ACCEPTED, ev.Scored): SCORING,
    (SCORING, ev.Scored): SCORING,
    (ACCEPTED, ev.Hidden): ACCEPTED,
}
#: The replies each request kind may get, besides DONE and ERROR.
KIND_REPLIES: dict[type[ev.Event], frozenset[type[ev.Event]]] = {
    ev.Submit: frozenset({ev.Accept, ev.Echo, ev.Data}),
    ev.Decide: frozenset({ev.Accept, ev.Decision}),
    ev.Score: frozenset({ev.Accept, ev.Scored, ev.Hidden}),
}
#: Reply kinds that belong to one request (ERROR and PONG are routed apart).
REQUEST_REPLY_CLASSES = (ev.Accept, ev.Echo, ev.Data, ev.Decision, ev.Scored, ev.Hidden, ev.Done)
REQUEST_REPLIES: frozenset[type[ev.Event]] = frozenset(REQUEST_REPLY_CLASSES)


class Breach(Exception):
    """A per-request invariant broken; ``args[0]`` is the reason."""


class RequestState:
    """One request in flight and what its replies have said so far.

    Built from the request event (Submit, Decide or Score; for Score,
    ``shape`` is the number of options per group, None when the payload does
    not parse). ``check(reply)`` raises Breach for a reply that breaks
    section 5's invariants and returns True when the reply ends the request.
    """

    __slots__ = (
        "id",
        "kind",
        "logprobs",
        "max_tokens",
        "counters",
        "shape",
        "phase",
        "prompt_tokens",
        "next_position",
        "n_data",
        "next_score",
        "longest_score",
    )

    def __init__(self, request: ev.Submit | ev.Decide | ev.Score, shape: tuple[int, ...] | None = None) -> None:
        self.id = request.id
        self.kind: type[ev.Submit | ev.Decide | ev.Score] = type(request)
        sub = request if type(request) is ev.Submit else None
        self.logprobs = sub.logprobs if sub is not None else 0
        self.max_tokens = sub.max_tokens if sub is not None else 0
        self.counters = sub.counters if sub is not None else self.kind is ev.Score
        self.shape = shape
        self.phase: type[Sentinel] = NEW
        self.prompt_tokens: int | None = None
        self.next_position: int | None = None
        self.n_data = 0
        self.next_score = (0, 0)
        self.longest_score = 0

    def check(self, e: ev.Event) -> bool:
        """Check reply ``e`` of this request; return True when it ends the request."""
        if type(e) is ev.Echo:
            self.echo(e)
            return False
        if type(e) is ev.Done:
            self._done(e)
            return True
        cls = type(e)
        if cls is ev.Error:
            return True
        if cls not in KIND_REPLIES[self.kind]:
            raise Breach(f"{cls.__name__.upper()} does not answer {self.kind.__name__.upper()}")
        nxt = REQUEST_TRANSITIONS.get((self.phase, cls))
        if nxt is None:
            raise Breach(f"{cls.__name__.upper()} after {self.phase!r}")
        if isinstance(e, ev.Data):
            self._data(e)
        elif isinstance(e, ev.Accept):
            self.prompt_tokens = e.prompt_tokens
        elif isinstance(e, ev.Scored):
            self._scored(e)
        elif isinstance(e, ev.Hidden) and (self.shape is None or e.group >= len(self.shape)):
            raise Breach(f"HIDDEN for group {e.group} of a SCORE of {len(self.shape or ())} groups")
        self.phase = nxt
        return False

    def echo(self, e: ev.Echo) -> None:
        """Check ECHO ``e`` of this request (``check`` for an ECHO, which never ends it)."""
        if self.phase is not ECHOING:
            if not self.logprobs or self.kind is not ev.Submit:
                raise Breach("ECHO for a request without logprobs")
            if (self.phase, ev.Echo) not in REQUEST_TRANSITIONS:
                raise Breach(f"ECHO after {self.phase!r}")
        elif e.position != self.next_position:
            raise Breach(f"ECHO position {e.position} where {self.next_position} was due")
        k = len(e.top)
        if k != self.logprobs and not (k == 0 and e.logprob != e.logprob):
            raise Breach(f"ECHO has {k} alternatives, the request asked for {self.logprobs}")
        if self.prompt_tokens is not None and e.position >= self.prompt_tokens:
            raise Breach(f"ECHO position {e.position} beyond the prompt's {self.prompt_tokens} tokens")
        self.next_position = e.position + 1
        self.phase = ECHOING

    def _data(self, e: ev.Data) -> None:
        if self.max_tokens and self.n_data >= self.max_tokens:
            raise Breach(f"DATA beyond max_tokens={self.max_tokens}")
        if not self.max_tokens:
            raise Breach("DATA for a read-out request (max_tokens=0)")
        if self.logprobs:
            if e.logprob is None or len(e.top) != self.logprobs:
                raise Breach(f"DATA must carry a logprob and {self.logprobs} alternatives")
        elif e.logprob is not None:
            raise Breach("DATA carries logprobs the request did not ask for")
        self.n_data += 1

    def _scored(self, e: ev.Scored) -> None:
        if self.shape is None:
            raise Breach("SCORED for a SCORE whose payload does not parse")
        if self.next_score[0] >= len(self.shape):
            raise Breach("SCORED after the last option")
        if (e.group, e.option) != self.next_score:
            raise Breach(f"SCORED {e.group} {e.option} where {self.next_score} was due")
        total = e.context_tokens + len(e.logprobs)
        if self.prompt_tokens is not None and total > self.prompt_tokens:
            raise Breach(f"SCORED reaches {total} tokens, beyond ACCEPT's {self.prompt_tokens}")
        self.longest_score = max(self.longest_score, total)
        grp, opt = e.group, e.option + 1
        if opt == self.shape[grp]:
            grp, opt = grp + 1, 0
        self.next_score = (grp, opt)

    def _done(self, e: ev.Done) -> None:
        if e.emitted != self.n_data:
            raise Breach(f"DONE says emitted={e.emitted} after {self.n_data} DATA frames")
        if self.prompt_tokens is not None and e.prompt_tokens != self.prompt_tokens:
            raise Breach(f"DONE says prompt_tokens={e.prompt_tokens}, ACCEPT said {self.prompt_tokens}")
        if e.has_counters != self.counters:
            raise Breach("DONE counters must be present exactly when the request asked for them")
        if self.kind is ev.Submit:
            if self.next_position is not None and self.next_position != e.prompt_tokens:
                raise Breach(
                    f"read-out ended at position {self.next_position - 1}, the prompt has {e.prompt_tokens} tokens"
                )
            if e.computed is not None and e.reused is not None and e.computed + e.reused != e.prompt_tokens:
                raise Breach(f"DONE computed={e.computed} + reused={e.reused} != prompt_tokens={e.prompt_tokens}")
        elif self.kind is ev.Decide:
            if self.phase is not DECIDED:
                raise Breach("DONE of a DECIDE without its DECISION")
        elif self.kind is ev.Score:
            if self.shape is not None and self.next_score != (len(self.shape), 0):
                raise Breach(f"DONE of a SCORE before all SCORED frames (next due {self.next_score})")
            if e.prompt_tokens != self.longest_score:
                raise Breach(
                    f"DONE says prompt_tokens={e.prompt_tokens}, the longest option reached {self.longest_score}"
                )
