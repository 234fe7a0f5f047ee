"""Prometheus metrics of the server, in one registry per app (``prometheus-client``).

Requests by route and status, request latency by route, prompt positions
computed vs reused by the engine, snapshot outcomes, questions answered by
type and path, decision-log lines lost, the engine's restarts and health (read from the engine at
scrape time), and the same per engine process (labels ``engine`` and ``model``:
up, restarts, requests in flight and waiting, requests routed to it); and the two gauges a fleet's
scheduler routes on, named as the Gateway API Inference Extension's model-server protocol names them in
vLLM (its TotalQueuedRequests and KVCacheUtilization; :class:`_Scheduling`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

#: Latency buckets in seconds: sub-millisecond gateway work up to cold model prefills.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The server's metrics. ``render()`` gives the text exposition format and its content type."""

    def __init__(
        self,
        engine_restarts: Callable[[], float] | None = None,
        engine_up: Callable[[], float] | None = None,
        engines: Callable[[], list[dict[str, Any]]] | None = None,
        load: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "serveproto_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=r
        )
        self.latency = Histogram(
            "serveproto_http_request_duration_seconds",
            "Time from a request's head to its answer",
            ["route"],
            buckets=BUCKETS,
            registry=r,
        )
        self.positions = Counter(
            "serveproto_prompt_positions", "Prompt positions the engine computed or reused", ["kind"], registry=r
        )
        self.from_disk = Counter(
            "serveproto_prompt_positions_from_disk",
            "Reused prompt positions the engine read from its cache directory (--cache-dir), written by an "
            "earlier engine process",
            registry=r,
        )
        self.snapshots = Counter(
            "serveproto_snapshots", "Snapshot outcomes of scoring requests", ["result"], registry=r
        )
        self.questions = Counter("serveproto_questions", "Questions answered", ["type", "path"], registry=r)
        self.option_tokens = Counter(
            "serveproto_option_tokens", "Option tokens read (scored, not generated)", registry=r
        )
        self.generated = Counter(
            "serveproto_generated_tokens", "Tokens generated on the chat and completion routes", registry=r
        )
        self.log_lines_lost = Counter(
            "serveproto_decision_log_lines_lost",
            "Decision-log lines not written (disk full, short write): their requests were answered, "
            "or refused with --log-decisions-required",
            registry=r,
        )
        self._children: dict[Any, Any] = {}
        restarts = Gauge("serveproto_engine_restarts", "Times the engine process was restarted", registry=r)
        up = Gauge("serveproto_engine_up", "1 when the engine is healthy", registry=r)
        restarts.set_function(engine_restarts or (lambda: 0.0))
        up.set_function(engine_up or (lambda: 1.0))
        self.routed = Counter(
            "serveproto_engine_requests", "Requests routed to each engine process", ["engine", "model"], registry=r
        )
        if engines is not None:
            r.register(_PerEngine(engines))
        if load is not None:
            r.register(_Scheduling(load))

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        pair = self._children.get(key)
        if pair is None:  # label lookups cost more than the increments: keep the children
            pair = self._children[key] = (self.requests.labels(route, method, str(status)), self.latency.labels(route))
        pair[0].inc()
        pair[1].observe(seconds)

    def observe_counters(
        self, computed: int | None, reused: int | None, snapshot: str | None, disk: int | None = None
    ) -> None:
        if disk is not None:
            self.from_disk.inc(disk)
        if computed is not None:
            self.positions.labels("computed").inc(computed)
        if reused is not None:
            self.positions.labels("reused").inc(reused)
        if snapshot is not None:
            self.snapshots.labels(snapshot).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _PerEngine:
    """Gauges read from every engine at scrape time: ``serveproto_engine_process_{up,restarts,in_flight,waiting}``
    labelled ``engine`` and ``model``; ``engines()`` gives ``gateway.server.fleet.Backend.status`` dicts."""

    FIELDS = (
        ("up", "1 when the engine process is healthy", "healthy"),
        ("restarts", "Times the engine process was restarted", "restarts"),
        ("in_flight", "Requests on the engine process now", "in_flight"),
        ("waiting", "Requests queued for the engine process's slots", "waiting"),
    )

    def __init__(self, engines: Callable[[], list[dict[str, Any]]]) -> None:
        self.engines = engines

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.engines()
        for field, doc, key in self.FIELDS:
            family = GaugeMetricFamily(f"serveproto_engine_process_{field}", doc, labels=["engine", "model"])
            for row in rows:
                family.add_metric([row["name"], row["model"]], float(row[key]))
            yield family


class _Scheduling:
    """The gauges a fleet's scheduler reads (the Gateway API Inference Extension's model-server protocol, its
    names as vLLM spells them, ``serveproto:`` for ``vllm:``), summed over the server's engines at scrape time.
    ``load()`` gives :meth:`gateway.server.fleet.Backend.load` dicts (``waiting``, ``running``, ``slots``).

    ``serveproto:num_requests_waiting`` (TotalQueuedRequests): requests queued for an engine's slots, batch
    items waiting for their turn included. ``serveproto:num_requests_running``: requests on the engines now.
    ``serveproto:kv_cache_usage_perc`` (KVCacheUtilization, 0 to 1 as vLLM's): the share of the KV cache
    that requests hold now. Each slot of an engine owns an equal share (``n_ctx`` cells), so this is the
    running requests (at most the slots) over the slots; what idle slots keep for reuse (a state's cells,
    snapshots) counts as free, as vLLM counts its prefix-cache blocks. Engines whose slots are unknown (no
    CAPS yet) count for neither; none known: 0.
    """

    def __init__(self, load: Callable[[], list[dict[str, Any]]]) -> None:
        self.load = load

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.load()
        yield GaugeMetricFamily(
            "serveproto:num_requests_waiting",
            "Requests waiting for an engine slot, batch items included (TotalQueuedRequests)",
            value=float(sum(r["waiting"] for r in rows)),
        )
        yield GaugeMetricFamily(
            "serveproto:num_requests_running",
            "Requests on the engines now",
            value=float(sum(r["running"] for r in rows)),
        )
        known = [r for r in rows if r["slots"]]
        slots = sum(r["slots"] for r in known)
        held = sum(min(r["running"], r["slots"]) for r in known)
        yield GaugeMetricFamily(
            "serveproto:kv_cache_usage_perc",
            "Share of the KV cache held by running requests, 0 to 1 (KVCacheUtilization): busy slots over slots",
            value=held / slots if slots else 0.0,
        )
