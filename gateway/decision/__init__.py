"""The decision room: closed questions in, calibrated probabilities out (no HTTP types).

``jev`` (the question schema: parse a Jev request body, shape answers),
``prompts`` and ``chat_template`` (the text the model reads), ``scoring`` (the
one softmax and normalisation rule, the reported numbers), ``debias`` and
``readings`` (position corrections, planned and combined), ``calibration``
(fitted maps), ``record`` (the decision record a decision engine reads),
``evalset`` and ``evaluation`` (the labelled set and its metrics).
May import :mod:`gateway.engine`; never :mod:`gateway.server`, :mod:`gateway.http` or :mod:`gateway.cli`.
"""
