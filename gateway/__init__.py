"""The gateway: everything between an HTTP client and an engine process, in five rooms.

Imports run one way (``tests/test_layers.py`` fails otherwise)::

    cli  ->  server  ->  decision  ->  engine
                 \\->  http

- :mod:`gateway.engine`: the engine processes: spawning, the serve protocol over
  their pipes, supervision and restarts, KV-slot queues, several engines (Pool),
  the model transcode, and design step 4 written once (``engine.score``: the one
  softmax and sum/mean rule, which the engine API and every room above use).
  Knows no HTTP and no questions.
- :mod:`gateway.decision`: closed questions: the Jev question schema, prompts and
  chat templates, the pipeline from a parsed request to answers, the reported
  numbers, position debiasing, calibration, the decision record, the labelled
  evaluation set. Knows no HTTP: it raises typed errors the server maps.
- :mod:`gateway.http`: the HTTP/1.1 server (h11 + anyio). Knows nothing above it.
- :mod:`gateway.server`: the application: routes (Jev, OpenAI, health and
  metrics, the page), each parse -> decision -> reply; the errors as HTTP,
  authentication, metrics.
- :mod:`gateway.cli`: the ``serveproto`` command and its sub-commands.

:mod:`gateway.paths` (where the repository, the engines and the cache are) is a
leaf every room may use.
"""
