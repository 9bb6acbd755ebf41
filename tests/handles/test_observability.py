"""Observing locks: hooks for every event, debug logs, one report per loss, OpenTelemetry."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from mongolock_async import AsyncMongoLock, LockHooks, LockLostError, LockManager
from mongolock_async.opentelemetry import OpenTelemetryHooks


class Recorder(LockHooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def acquired(self, name: str, **details: Any) -> None:
        self.events.append(("acquired", name, details))

    def not_acquired(self, name: str, **details: Any) -> None:
        self.events.append(("not_acquired", name, details))

    def renewed(self, name: str, **details: Any) -> None:
        self.events.append(("renewed", name, details))

    def released(self, name: str, **details: Any) -> None:
        self.events.append(("released", name, details))

    def lost(self, name: str, **details: Any) -> None:
        self.events.append(("lost", name, details))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.events]


@pytest.mark.timing(margin=2.4)  # 3 s leases renewed every 0.3 s; lost within 5 s
async def test_hooks_hear_every_event(mongolock_collection: Any) -> None:
    hooks = Recorder()
    locks = LockManager(mongolock_collection, ttl=3.0, hooks=hooks)
    async with locks("job", heartbeat=0.3) as lock:
        token = lock.fencing_token
        assert await locks("job", blocking=False).acquire() is False
        await asyncio.sleep(0.5)
        for _ in range(100):  # a renewal answered (the first is sent after 0.3 s: a fixed 0.5 s left 0.2 s)
            if "renewed" in hooks.kinds():
                break
            await asyncio.sleep(0.05)
    assert hooks.kinds()[:2] == ["acquired", "not_acquired"]
    assert "renewed" in hooks.kinds() and hooks.kinds()[-1] == "released"
    acquired, released = hooks.events[0][2], hooks.events[-1][2]
    assert acquired["fencing_token"] == token and acquired["waited"] >= 0
    assert released["fencing_token"] == token and released["held"] >= 0.5
    stolen = locks("stolen", heartbeat=0.2)
    assert await stolen.acquire()
    await mongolock_collection.update_one({"_id": "stolen"}, {"$set": {"owner": "intruder"}})
    await asyncio.wait_for(stolen.lost.wait(), 5)
    kind, name, details = hooks.events[-1]
    assert (kind, name) == ("lost", "stolen") and "another owner" in details["reason"]


@pytest.mark.timing(margin=2.5)  # a 3 s lease, owned and released
async def test_a_failing_hook_is_logged_and_the_lock_works(
    mongolock_collection: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(LockHooks):
        def acquired(self, name: str, **details: Any) -> None:
            raise RuntimeError("the metrics backend is down")

    lock = AsyncMongoLock(mongolock_collection, "observed", ttl=3.0, hooks=Broken())
    async with lock:
        assert await lock.owned()
    assert "the acquired hook for lock 'observed' failed" in caplog.text
    with pytest.raises(TypeError, match="hooks"):
        AsyncMongoLock(mongolock_collection, "observed", hooks=object())  # type: ignore[arg-type]


@pytest.mark.timing(margin=2.4)  # a 3 s lease renewed every 0.3 s
async def test_debug_logs_and_a_loss_reported_once(mongolock_collection: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="mongolock_async")
    async with AsyncMongoLock(mongolock_collection, "logged", ttl=3.0, heartbeat=0.3):
        await asyncio.sleep(0.4)
        for _ in range(100):  # a renewal answered (sent after 0.3 s: a fixed 0.4 s left 0.1 s)
            if any(record.getMessage().startswith("renewed 1 of 1 leases") for record in caplog.records):
                break
            await asyncio.sleep(0.05)
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith("acquired 'logged'") for message in messages)
    assert any(message.startswith("renewed 1 of 1 leases") for message in messages)
    assert any(message.startswith("released 'logged'") for message in messages)
    caplog.clear()
    with pytest.raises(LockLostError):
        async with AsyncMongoLock(mongolock_collection, "short", ttl=0.3):
            await asyncio.sleep(2)
    # The block raises it: it is not also logged as a warning.
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    held = AsyncMongoLock(mongolock_collection, "explicit", ttl=0.3)
    assert await held.acquire()
    await asyncio.wait_for(held.lost.wait(), 5)
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'explicit' was lost" in warnings[0].getMessage()


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Each metric's data points so far, by name."""
    data = reader.get_metrics_data()
    if data is None:
        return {}
    scopes = [scope for resource in data.resource_metrics for scope in resource.scope_metrics]
    return {metric.name: list(metric.data.data_points) for scope in scopes for metric in scope.metrics}


@pytest.mark.timing(margin=2.4)  # 3 s leases renewed every 0.3 s
async def test_opentelemetry_metrics_and_spans(mongolock_collection: Any) -> None:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    hooks = OpenTelemetryHooks(MeterProvider(metric_readers=[reader]), tracer_provider)
    locks = LockManager(mongolock_collection, ttl=3.0, hooks=hooks)
    async with locks("sku-1", heartbeat=0.3):
        assert await locks("sku-1", blocking=False).acquire() is False
        await asyncio.sleep(0.4)
        # At least one renewal before the release (on a loaded machine the first can come late).
        for _ in range(100):
            if "mongolock.renewals" in _points(reader):
                break
            await asyncio.sleep(0.1)
    lost = locks("sku-2", heartbeat=0.2)
    assert await lost.acquire()
    await mongolock_collection.update_one({"_id": "sku-2"}, {"$set": {"owner": "intruder"}})
    await asyncio.wait_for(lost.lost.wait(), 5)

    points = _points(reader)
    outcomes = {(p.attributes["mongolock.name"], p.attributes["mongolock.outcome"]): p.count
                for p in points["mongolock.acquire.duration"]}  # fmt: skip
    assert outcomes == {("sku-1", "acquired"): 1, ("sku-1", "not_acquired"): 1, ("sku-2", "acquired"): 1}
    holds = {p.attributes["mongolock.outcome"]: p for p in points["mongolock.hold.duration"]}
    assert holds["released"].count == 1 and holds["released"].sum >= 0.4 and holds["lost"].count == 1
    assert {p.attributes["mongolock.name"]: p.value for p in points["mongolock.held"]} == {"sku-1": 0, "sku-2": 0}
    assert [p.value for p in points["mongolock.lost"]] == [1]
    assert sum(p.value for p in points["mongolock.renewals"]) >= 1

    finished = spans.get_finished_spans()
    assert [span.name for span in finished].count("mongolock.acquire") == 3
    hold_spans = {span.attributes["mongolock.outcome"]: span for span in finished if span.name == "mongolock.hold"}
    assert hold_spans["released"].status.status_code is StatusCode.UNSET
    assert hold_spans["lost"].status.status_code is StatusCode.ERROR
    released = hold_spans["released"]
    assert released.end_time - released.start_time >= 0.4e9, "the span covers the time held"
