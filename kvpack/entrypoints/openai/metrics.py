"""Prometheus metrics for `GET /metrics`, in a `CollectorRegistry` of the app's own.

Engine gauges are read at scrape time from the engine thread's latest stats snapshot (so a
scrape never touches the engine); request and token counters are counted by the server.

| metric | kind | meaning |
|---|---|---|
| kvpack_num_requests_running / _waiting | gauge | sequences the scheduler runs / queues |
| kvpack_server_requests_waiting | gauge | admitted HTTP requests with no output yet (--max-queue) |
| kvpack_kv_cache_usage_ratio | gauge | used fraction of the KV blocks |
| kvpack_kv_cache_free_blocks / _total_blocks | gauge | free and total KV blocks |
| kvpack_prefix_cache_hit_rate | gauge | prompt tokens served from the prefix cache / prompt tokens |
| kvpack_num_preemptions_total | counter | sequences preempted (engine total) |
| kvpack_prompt_tokens_total / kvpack_generation_tokens_total | counter | tokens served |
| kvpack_request_success_total{finished_reason} | counter | choices finished (stop, length, abort) |
| kvpack_request_rejected_overload_total | counter | requests answered 503 for --max-queue |
| kvpack_http_errors_total{status} | counter | error responses by HTTP status |
| kvpack_kv_cache_format_info{k_format, v_format, ...} | info | the KV format in use |
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Engine stats key -> accepted spellings (the first one present wins).
_STAT_KEYS = {
    "running": ("num_running", "running"),
    "waiting": ("num_waiting", "waiting"),
    "kv_usage": ("kv_cache_usage", "kv_usage", "cache_usage"),
    "prefix_hit_rate": ("prefix_cache_hit_rate", "prefix_hit_rate"),
    "preemptions": ("num_preemptions", "preemptions"),
    "total_blocks": ("num_total_blocks", "num_blocks", "total_blocks"),
}


def stat(stats: dict[str, Any], key: str, default: float = 0.0) -> float:
    for name in _STAT_KEYS.get(key, (key,)):
        if stats.get(name) is not None:
            return float(stats[name])
    return default


class _EngineCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]], server_waiting: Callable[[], int],
                 kv_info: dict[str, str]):
        self._snapshot, self._server_waiting, self._kv_info = snapshot, server_waiting, kv_info

    def collect(self):
        s = self._snapshot() or {}
        gauges = [
            ("kvpack_num_requests_running", "Sequences running in the engine.", stat(s, "running")),
            ("kvpack_num_requests_waiting", "Sequences waiting in the engine.", stat(s, "waiting")),
            ("kvpack_server_requests_waiting",
             "Admitted HTTP requests that have not received output yet.", self._server_waiting()),
            ("kvpack_kv_cache_usage_ratio", "Used fraction of the KV cache blocks (0..1).",
             stat(s, "kv_usage")),
            ("kvpack_kv_cache_free_blocks", "Free KV cache blocks.", stat(s, "num_free_blocks")),
            ("kvpack_kv_cache_total_blocks", "KV cache blocks in the pool.", stat(s, "total_blocks")),
            ("kvpack_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache (0..1).",
             stat(s, "prefix_hit_rate")),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("kvpack_num_preemptions", "Sequences preempted.",
                                  value=stat(s, "preemptions"))
        yield InfoMetricFamily("kvpack_kv_cache_format", "KV cache format in use.",
                               value=self._kv_info)


class ServerMetrics:
    """The app's registry and the counters the handlers bump."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], server_waiting: Callable[[], int],
                 kv_info: dict[str, Any]):
        disable_created_metrics()  # no `*_created` samples next to the counters (process-wide)
        self.registry = CollectorRegistry(auto_describe=True)
        info = {k: str(v) for k, v in kv_info.items()}
        self.registry.register(_EngineCollector(snapshot, server_waiting, info))
        r = self.registry
        self.prompt_tokens = Counter("kvpack_prompt_tokens", "Prompt tokens served.", registry=r)
        self.generation_tokens = Counter("kvpack_generation_tokens", "Tokens generated.", registry=r)
        self.request_success = Counter("kvpack_request_success", "Choices finished, by reason.",
                                       ["finished_reason"], registry=r)
        self.rejected_overload = Counter("kvpack_request_rejected_overload",
                                         "Requests answered 503 because --max-queue was full.",
                                         registry=r)
        self.http_errors = Counter("kvpack_http_errors", "Error responses, by HTTP status.",
                                   ["status"], registry=r)

    def record_usage(self, prompt_tokens: int, completion_tokens: int,
                     finish_reasons: list[str | None]) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        for reason in finish_reasons:
            self.request_success.labels(finished_reason=reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
