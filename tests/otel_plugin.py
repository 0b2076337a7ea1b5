"""A pytest plugin: an OpenTelemetry MeterProvider set, instruments made.

``pytest -p otel_plugin test_hit_frames.py`` runs the hit-path frame
guards with metrics on (see tests/test_events.py).
"""

from __future__ import annotations

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from poolkeeper import _events


def pytest_configure(config: object) -> None:
    del config
    metrics.set_meter_provider(
        MeterProvider(metric_readers=[InMemoryMetricReader()])
    )
    made = _events.instruments()
    assert made is not None
    print("otel_plugin: provider set, instruments made")
