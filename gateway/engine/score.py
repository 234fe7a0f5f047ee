"""Which read-out positions an option owns, and its scored tokens (:class:`OptionScore`).

The engine API returns option logprobs only; what they mean as probabilities (design step 4:
the sum or mean, the softmax) is the decision room's arithmetic
(:mod:`gateway.decision.arithmetic`).

The scored tokens of option ``o`` (spec/serve-protocol.md section 9.1) are the
tokens of ``prefix + stem + option`` after its longest common token prefix with
``prefix + stem``. Without the SCORE extension they are found in the ECHO
read-out of the option's SUBMIT: the first position whose token text differs
from the stem's read-out at that position, or that lies past the stem's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from gateway.engine.errors import RequestError
from serveproto import Echo


@attrs.frozen
class OptionScore:
    """One option's scored tokens.

    ``context_tokens``: tokens before the option's first scored token;
    ``logprobs``: shape ``(n,)``, natural-log probability of each scored token
    given everything before it (spec 9.1); ``option``: the option text.
    """

    context_tokens: int
    logprobs: tuple[float, ...]
    option: str = ""

    @property
    def n_tokens(self) -> int:
        """How many tokens the option scored (``len(logprobs)``)."""
        return len(self.logprobs)

    @property
    def logprob(self) -> float:
        """Sum of ``logprobs``: the option's log-probability (nats)."""
        return math.fsum(self.logprobs)

    @property
    def mean_logprob(self) -> float:
        """Mean of ``logprobs`` (nats per token), the seed's ``normalize="mean"``."""
        return self.logprob / len(self.logprobs) if self.logprobs else float("nan")


def option_tokens(
    echoes: Iterable[Echo], known: Mapping[int, bytes], context_len: int, *, where: str = "option"
) -> tuple[int, tuple[float, ...]]:
    """``(context_tokens, logprobs)`` of an option from its SUBMIT's ECHO read-out.

    ``echoes``: the option's ``Echo`` events (``position``, ``logprob``, ``text``);
    ``known``: token text by position from the read-outs of ``prefix + stem``
    (and of the prefix); ``context_len``: the token count of ``prefix + stem``.
    A position the option was not read out at was reused from the KV cache or
    a snapshot, hence shared with the context. Raises :class:`RequestError`
    ``BAD_REQUEST`` (as SCORE would) when the option owns no token, or when its
    first owned token is position 0 (nothing to condition on).
    """
    echoes = sorted(echoes, key=lambda e: e.position)
    for i, ev in enumerate(echoes):
        text = known.get(ev.position)
        if ev.position >= context_len or (text is not None and text != ev.text):
            owned = echoes[i:]
            if ev.position == 0:
                raise RequestError(
                    "BAD_REQUEST", f"{where}: its first token is the text's first token; nothing conditions it"
                )
            return ev.position, tuple(float(e.logprob) for e in owned)
    raise RequestError("BAD_REQUEST", f"{where}: has no token of its own after the context")
