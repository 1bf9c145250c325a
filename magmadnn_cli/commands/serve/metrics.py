"""The counters `magmadnn serve` shows at GET /metrics, in Prometheus' text format 0.0.4."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        counts = self.counts or [0] * len(self.bounds)
        sep = "," if labels else ""
        return ([f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.bounds, counts)]
                + [f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}',
                   f"{name}_sum{{{labels}}} {self.total:.6f}" if labels else f"{name}_sum {self.total:.6f}",
                   f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}"])


class Metrics:
    """Counters for /metrics (Prometheus' text format 0.0.4): requests by endpoint and status,
    latency of the prediction endpoints, rows answered, rows per model batch, requests in flight."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batches = Histogram(BATCH_BUCKETS)
        self.rows = 0
        self.in_flight = 0

    def request(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        if path in ("/predict", "/invocations"):
            self.latency.setdefault(path, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, rows: int) -> None:
        self.batches.observe(rows)

    def text(self) -> str:
        lines = ["# HELP magmadnn_requests_total HTTP requests answered, by endpoint and status code.",
                 "# TYPE magmadnn_requests_total counter"]
        lines += [f'magmadnn_requests_total{{endpoint="{p}",status="{s}"}} {n}'
                  for (p, s), n in sorted(self.requests.items())]
        lines += ["# HELP magmadnn_request_seconds Time to answer a prediction request.",
                  "# TYPE magmadnn_request_seconds histogram"]
        for path, histogram in sorted(self.latency.items()):
            lines += histogram.lines("magmadnn_request_seconds", f'endpoint="{path}"')
        lines += ["# HELP magmadnn_rows_total Rows predicted.", "# TYPE magmadnn_rows_total counter",
                  f"magmadnn_rows_total {self.rows}",
                  "# HELP magmadnn_batch_rows Rows in each batch the model's thread took.",
                  "# TYPE magmadnn_batch_rows histogram", *self.batches.lines("magmadnn_batch_rows"),
                  "# HELP magmadnn_requests_in_flight Requests being answered now.",
                  "# TYPE magmadnn_requests_in_flight gauge", f"magmadnn_requests_in_flight {self.in_flight}"]
        return "\n".join(lines) + "\n"
