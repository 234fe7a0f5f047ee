"""The gateway: everything between an HTTP client and an engine process, in six rooms.

Imports run one way (``tests/gateway/test_layers.py`` fails otherwise)::

    cli  ->  server  ->  decision  ->  engine
     \\          \\->  http
      \\->  lab  ->  decision

- :mod:`gateway.engine`: the engine processes: spawning, the serve protocol over
  their pipes, supervision and restarts, KV-slot queues, several engines (Pool),
  the model transcode; its API returns option logprobs only (``engine.score``).
  Knows no HTTP and no questions.
- :mod:`gateway.decision`: closed questions: the question schema, prompts and
  chat templates, the pipeline from a parsed request to answers, design step 4
  written once (``decision.arithmetic``: the one softmax and sum/mean rule), the
  reported numbers, position debiasing, calibration and heads as served, the
  decision record. Knows no HTTP and no numpy: it raises typed errors the server maps.
- :mod:`gateway.lab`: offline evaluation and fitting, with numpy: the labelled
  evaluation set, its metrics, calibration and head fitting, reliability diagrams,
  the decision log read back. Imported by the CLI and ``bench/`` only.
- :mod:`gateway.http`: the HTTP/1.1 server (h11 + anyio). Knows nothing above it.
- :mod:`gateway.server`: the application: routes (Jev in ``server/jev/``, OpenAI in
  ``server/openai/``, rerank in ``server/rerank/``, health and metrics, the page), each parse -> decision -> reply; the
  errors as HTTP, authentication, metrics.
- :mod:`gateway.cli`: the ``serveproto`` command and its sub-commands.

:mod:`gateway.paths` (where the repository, the engines and the cache are) is a
leaf every room may use.
"""
