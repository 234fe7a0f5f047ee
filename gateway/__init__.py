"""The gateway: everything between an HTTP client and an engine process, in five rooms.

Imports run one way (``tests/test_layers.py`` fails otherwise)::

    cli  ->  server  ->  decision  ->  engine
                 \\->  http

- :mod:`gateway.engine`: the engine processes: spawning, the serve protocol over
  their pipes, supervision and restarts, KV-slot queues, several engines (Pool),
  the model transcode. Knows no HTTP and no questions.
- :mod:`gateway.decision`: closed questions: the Jev question schema, prompts and
  chat templates, the one scoring module (softmax, normalisation, the reported
  numbers), position debiasing, calibration, the decision record, the labelled
  evaluation set. Knows no HTTP.
- :mod:`gateway.http`: the HTTP/1.1 server (h11 + anyio). Knows nothing above it.
- :mod:`gateway.server`: the application: routes (Jev, OpenAI, health and
  metrics, the page), authentication, refusals, metrics.
- :mod:`gateway.cli`: the ``serveproto`` command and its sub-commands.

:mod:`gateway.paths` (where the repository, the engines and the cache are) is a
leaf every room may use.
"""
