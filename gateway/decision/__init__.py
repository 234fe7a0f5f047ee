"""The decision room: closed questions in, calibrated probabilities out (no HTTP types).

``pipeline`` (a parsed request + an engine + the server's settings in, each
question's probabilities out: what the routes, ``serveproto calibrate`` and the
benchmarks call), ``errors`` (what it raises: refusals naming the request's
field, timeouts, unusable answers), ``refusals`` (an engine's refusal as the
request's field), ``jev`` (the question schema: parse a Jev request body, shape
answers), ``prompts`` and ``chat_template`` (the text the model reads),
``arithmetic`` (design step 4: the sum/mean rule and the softmax over option
logprobs), ``scoring`` (the reported numbers), ``debias`` and ``readings`` (position
corrections, planned and combined), ``calibration`` (fitted maps, loaded and applied),
``heads`` (fitted heads, loaded and applied), ``record`` (the decision record a decision
engine reads), ``decision_log`` (``--log-decisions``, written), ``conversation`` (a chat as a state) and ``chat_jev``
(the chat route's ``jev`` object: its questions, its modes, decide-then-generate's note). Fitting and evaluating
are the lab's (:mod:`gateway.lab`); no numpy here.
May import :mod:`gateway.engine`; never :mod:`gateway.lab`, :mod:`gateway.server`, :mod:`gateway.http`
or :mod:`gateway.cli`.
"""
