"""OpenTelemetry metrics and spans for locks (the ``opentelemetry`` extra; from a checkout:
``pip install '.[opentelemetry]'``).

```python
locks = LockManager(collection, hooks=OpenTelemetryHooks())
```

Uses the global meter and tracer providers unless given others. Metrics, all with the attribute
``mongolock.name``:

- ``mongolock.acquire.duration`` (s, histogram): how long ``acquire`` took, the wait included;
  ``mongolock.outcome`` is ``acquired`` or ``not_acquired``.
- ``mongolock.hold.duration`` (s, histogram): how long a lease was held; ``mongolock.outcome`` is
  ``released`` or ``lost``.
- ``mongolock.held`` (up-down counter): leases held now. ``mongolock.lost`` and
  ``mongolock.renewals`` (counters).

Spans: ``mongolock.acquire`` for each acquire (from the call to its outcome) and ``mongolock.hold``
for each lease held (from acquisition to release, or to loss with an error status), with the
attributes above and ``mongolock.fencing_token``.
"""

from .integrations.opentelemetry import OpenTelemetryHooks

__all__ = [
    "OpenTelemetryHooks",
]
