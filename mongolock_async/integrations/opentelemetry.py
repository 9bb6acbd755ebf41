"""The implementation of ``mongolock_async.opentelemetry`` (its public path; the user guide is there)."""

from __future__ import annotations

import time

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Status, StatusCode
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        "mongolock_async.opentelemetry needs the OpenTelemetry API: install the opentelemetry extra (from a "
        f"checkout: pip install '.[opentelemetry]') ({error})",
        name=error.name,
    ) from error

from .._version import __version__
from ..hooks import LockHooks
from ..store.documents import Period

__all__ = ["OpenTelemetryHooks"]

_NAME = "mongolock.name"
_OUTCOME = "mongolock.outcome"
_TOKEN = "mongolock.fencing_token"


class OpenTelemetryHooks(LockHooks):
    """[`LockHooks`][mongolock_async.LockHooks] that record OpenTelemetry metrics and spans."""

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        meter = metrics.get_meter("mongolock_async", __version__, meter_provider)
        self._tracer = trace.get_tracer("mongolock_async", __version__, tracer_provider)
        self._acquire = meter.create_histogram(
            "mongolock.acquire.duration", unit="s", description="Time acquire took, waiting included"
        )
        self._hold = meter.create_histogram("mongolock.hold.duration", unit="s", description="Time a lease was held")
        self._held = meter.create_up_down_counter("mongolock.held", unit="{lease}", description="Leases held now")
        self._lost = meter.create_counter("mongolock.lost", unit="{lease}", description="Leases lost while held")
        self._renewals = meter.create_counter("mongolock.renewals", unit="{renewal}", description="Lease renewals")
        self._job_runs = meter.create_histogram(
            "mongolock.job.duration", unit="s", description="Time a job's run took, by how it ended"
        )
        self._job_skips = meter.create_counter(
            "mongolock.job.skips", unit="{call}", description="Calls of a job that did not run it, by reason"
        )

    def acquired(self, name: str, *, fencing_token: int, waited: float) -> None:
        self._acquire.record(waited, {_NAME: name, _OUTCOME: "acquired"})
        self._held.add(1, {_NAME: name})
        self._span("mongolock.acquire", waited, {_NAME: name, _OUTCOME: "acquired", _TOKEN: fencing_token})

    def not_acquired(self, name: str, *, waited: float) -> None:
        self._acquire.record(waited, {_NAME: name, _OUTCOME: "not_acquired"})
        self._span("mongolock.acquire", waited, {_NAME: name, _OUTCOME: "not_acquired"})

    def renewed(self, name: str, *, fencing_token: int) -> None:
        self._renewals.add(1, {_NAME: name})

    def released(self, name: str, *, fencing_token: int, held: float) -> None:
        self._hold.record(held, {_NAME: name, _OUTCOME: "released"})
        self._held.add(-1, {_NAME: name})
        self._span("mongolock.hold", held, {_NAME: name, _OUTCOME: "released", _TOKEN: fencing_token})

    def lost(self, name: str, *, fencing_token: int, held: float, reason: str) -> None:
        self._hold.record(held, {_NAME: name, _OUTCOME: "lost"})
        self._held.add(-1, {_NAME: name})
        self._lost.add(1, {_NAME: name})
        self._span(
            "mongolock.hold", held, {_NAME: name, _OUTCOME: "lost", _TOKEN: fencing_token}, error=reason
        )

    def job_ran(self, name: str, *, outcome: str, duration: float, period: Period | None, attempt: int) -> None:
        self._job_runs.record(duration, {_NAME: name, _OUTCOME: outcome})
        attributes: dict[str, str | int] = {_NAME: name, _OUTCOME: outcome, "mongolock.job.attempt": attempt}
        if period is not None:
            attributes["mongolock.job.period_start"] = period.start.isoformat()
            attributes["mongolock.job.period_end"] = period.end.isoformat()
        self._span("mongolock.job.run", duration, attributes, error=None if outcome == "succeeded" else outcome)

    def job_skipped(self, name: str, *, reason: str, period: Period | None) -> None:
        self._job_skips.add(1, {_NAME: name, "mongolock.job.reason": reason})

    def _span(self, span_name: str, seconds: float, attributes: dict[str, str | int], error: str | None = None) -> None:
        """A span that ended now and began ``seconds`` ago."""
        end = time.time_ns()
        span = self._tracer.start_span(span_name, start_time=end - int(seconds * 1e9), attributes=attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)
