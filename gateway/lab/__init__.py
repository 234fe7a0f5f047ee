"""The lab room: offline evaluation and fitting, with numpy (never on the serving path).

``evalset`` (the generated labelled set and a user's labelled JSONL), ``evaluation``
(accuracy, macro-F1, ECE, Brier, NLL, order stability), ``calibration_fit`` (fitting
and cross-validating the maps :mod:`gateway.decision.calibration` serves, and the file
``serveproto calibrate`` writes), ``reliability`` (reliability diagrams, text and PNG),
``head_fit`` (fitting the heads :mod:`gateway.decision.heads` serves), ``logged_answers``
(a judged decision log read back for fitting).
Imported by :mod:`gateway.cli` and ``bench/`` only; may import :mod:`gateway.decision`,
:mod:`gateway.engine` and :mod:`gateway.paths`, never :mod:`gateway.server`, :mod:`gateway.http`
or :mod:`gateway.cli` (``tests/gateway/test_layers.py``).
"""
