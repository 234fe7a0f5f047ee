"""The benchmarks: timing, side by side in one run, never in a test (``bench/README.md`` says how to run each).

Each benchmark is a module run from the repository root as ``python -m bench.<name>`` (``bench.gpu.<name>``
for the GPU machine's); they share one server helper (:mod:`bench.servers`) and one engine client
(:mod:`bench.timed_engine`, the tests' ``fixtures.sync_engine`` with timed requests). The results and the
lab notebook that reads them are in ``bench/results/`` (``INDEX.md``, ``NOTEBOOK.md``). Not installed with
the package; nothing in ``serveproto/``, ``gateway/`` or the quick tier of ``tests/`` imports it.
"""

from pathlib import Path

#: The checkout this package is part of (``python -m bench.<name>`` runs from here).
ROOT = Path(__file__).resolve().parents[1]
