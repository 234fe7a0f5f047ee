"""The decision room: closed questions in, calibrated probabilities out (no HTTP types).

``pipeline`` (a parsed request + an engine + the server's settings in, each
question's probabilities out: what the routes, ``serveproto calibrate`` and the
benchmarks call), ``errors`` (what it raises: refusals naming the request's
field, timeouts, unusable answers), ``refusals`` (an engine's refusal as the
request's field), ``jev`` (the question schema: parse a Jev request body, shape
answers), ``prompts`` and ``chat_template`` (the text the model reads),
``scoring`` (the reported numbers; the softmax and sum/mean rule it reports are
:mod:`gateway.engine.score`'s), ``debias`` and ``readings`` (position
corrections, planned and combined), ``calibration`` (fitted maps), ``record``
(the decision record a decision engine reads), ``evalset`` and ``evaluation``
(the labelled set and its metrics).
May import :mod:`gateway.engine`; never :mod:`gateway.server`, :mod:`gateway.http` or :mod:`gateway.cli`.
"""
