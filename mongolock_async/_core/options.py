"""The options every lease-holding handle shares (a lock, a semaphore, a read-write lock's
handles, an election, a job's runs): their defaults and their checks.

``LeaseOptions.checked`` checks them all, before any I/O, with the same errors whichever handle
(or ``LockManager``) they were given to. The keyword sets each handle's constructor takes are
typed dictionaries declared with the lock (``_core/lock.py``), since ``on_lost`` is called with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Literal

from pymongo.write_concern import WriteConcern

from .._runtime.lease import default_safety_margin
from .._util import validation
from ..hooks import LockHooks

_MAJORITY = WriteConcern(w="majority")
"""The default write concern: an acknowledged acquisition survives a primary failover."""

UnreachableTimeout = float | Literal["server_selection"] | None


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseOptions:
    """A handle's options, checked (see ``checked``); the defaults are a lock's."""

    ttl: float = 30.0
    blocking: bool = True
    timeout: float | None = None
    label: str | None = None
    # A factory only because WriteConcern is unhashable, which dataclasses takes for mutable.
    write_concern: WriteConcern = dataclasses.field(default_factory=lambda: _MAJORITY)
    heartbeat: bool | float = False
    safety_margin: float | None = None
    # Typed loosely here: its type (OnLost) names the lock, which imports these options.
    on_lost: Callable[[Any], Awaitable[None] | None] | None = None
    fair: bool = False
    hooks: LockHooks | None = None
    retry_base: float = 0.05
    retry_cap: float = 1.0
    unreachable_timeout: UnreachableTimeout = "server_selection"

    @classmethod
    def checked(cls, owner: str, accepted: Collection[str], **keywords: Any) -> LeaseOptions:
        """The options ``keywords`` sets over the defaults, each checked.

        ``owner`` names the callable in errors; ``accepted`` is the set of option names it takes
        besides ``ttl`` (a keyword outside it is a ``TypeError``, as Python's own). Raises
        ``TypeError`` or ``ValueError`` for a value of the wrong type or out of range, naming the
        option; does no I/O.
        """
        for keyword in keywords:
            if keyword != "ttl" and keyword not in accepted:
                raise TypeError(f"{owner}() got an unexpected keyword argument {keyword!r}")
        values = {**_DEFAULTS, **keywords}
        ttl = validation.ttl(values["ttl"])
        blocking = validation.flag(values["blocking"], "blocking")
        timeout = validation.optional_timeout(values["timeout"])
        validation.timeout_needs_blocking(blocking, timeout)
        safety_margin = values["safety_margin"]
        if safety_margin is not None:
            safety_margin = validation.seconds(safety_margin, "safety_margin", allow_zero=True)
            if safety_margin >= ttl:
                raise ValueError(f"safety_margin ({safety_margin:g} s) must be smaller than ttl ({ttl:g} s)")
        heartbeat = values["heartbeat"]
        if not isinstance(heartbeat, bool):
            heartbeat = validation.seconds(heartbeat, "heartbeat")
        on_lost = values["on_lost"]
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable, not {type(on_lost).__name__}")
        hooks = values["hooks"]
        if hooks is not None and not isinstance(hooks, LockHooks):
            raise TypeError(f"hooks must be a mongolock_async.LockHooks, not {type(hooks).__name__}")
        retry_base = validation.seconds(values["retry_base"], "retry_base")
        options = cls(
            ttl=ttl,
            blocking=blocking,
            timeout=timeout,
            label=validation.optional_label(values["label"]),
            write_concern=validation.write_concern(values["write_concern"]),
            heartbeat=heartbeat,
            safety_margin=safety_margin,
            on_lost=on_lost,
            fair=validation.flag(values["fair"], "fair"),
            hooks=hooks,
            retry_base=retry_base,
            retry_cap=validation.seconds(values["retry_cap"], "retry_cap", minimum=retry_base),
            unreachable_timeout=validation.unreachable_timeout(values["unreachable_timeout"]),
        )
        options.heartbeat_interval(ttl)  # a heartbeat that cannot fit raises now
        return _shared(options)

    def safety_margin_for(self, ttl: float) -> float:
        """How long before a lease of ``ttl`` seconds ends its holder stops believing it holds it."""
        return default_safety_margin(ttl) if self.safety_margin is None else self.safety_margin

    def heartbeat_interval(self, ttl: float) -> float | None:
        """The renewal interval for a lease of ``ttl`` seconds, or None when the heartbeat is off;
        ``ValueError`` if two renewals do not fit before the local deadline."""
        if self.heartbeat is False:
            return None
        interval = ttl / 3 if self.heartbeat is True else float(self.heartbeat)
        margin = self.safety_margin_for(ttl)
        if 2 * interval > ttl - margin:
            raise ValueError(
                f"heartbeat interval {interval:g} s leaves no room for two renewals inside ttl {ttl:g} s "
                f"minus the safety margin {margin:g} s; use at most {(ttl - margin) / 2:g} s"
            )
        return interval


_DEFAULTS = {field.name: getattr(LeaseOptions(), field.name) for field in dataclasses.fields(LeaseOptions)}


_last_checked: list[LeaseOptions] = [LeaseOptions()]


def _shared(options: LeaseOptions) -> LeaseOptions:
    """The options last checked, if ``options`` are the same, else ``options`` (remembered).

    Handles made in a loop (one per order, tenant or file) mostly have the same options: they share
    one frozen object rather than hold a copy each (136 bytes a handle). The same means each field
    of the same type and equal: ``heartbeat=True`` (a third of the TTL) is not ``heartbeat=1.0``.
    """
    last = _last_checked[0]
    for field in _FIELDS:
        mine, theirs = getattr(options, field), getattr(last, field)
        if type(mine) is not type(theirs) or mine != theirs:
            _last_checked[0] = options
            return options
    return last


_FIELDS = tuple(field.name for field in dataclasses.fields(LeaseOptions))
