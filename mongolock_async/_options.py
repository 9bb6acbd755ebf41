"""The options every lease-holding handle shares (a lock, a semaphore, a read-write lock's
handles, an election, a job's runs): their one definition, their defaults and their checks.

The keyword sets are typed dictionaries, so that each handle's constructor takes exactly the
options that apply to it (``**options: Unpack[LockKeywords]``) and a type checker sees a
misspelt or misplaced one. ``LeaseOptions.checked`` checks them all, before any I/O, with the
same errors whichever handle (or ``LockManager``) they were given to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pymongo.write_concern import WriteConcern

from . import _validate
from .hooks import LockHooks
from .lease import default_safety_margin

if TYPE_CHECKING:
    from .lock import AsyncMongoLock

OnLost = Callable[["AsyncMongoLock"], Awaitable[None] | None]
"""Called with the handle whose lease was lost; a coroutine function runs in its own task."""

_MAJORITY = WriteConcern(w="majority")
"""The default write concern: an acknowledged acquisition survives a primary failover."""

UnreachableTimeout = float | Literal["server_selection"] | None


class LeaseKeywords(TypedDict, total=False):
    """The options of a lease (a job's run takes these); each is described on
    [`AsyncMongoLock`][mongolock_async.AsyncMongoLock]."""

    label: str | None
    write_concern: WriteConcern
    heartbeat: bool | float
    safety_margin: float | None
    on_lost: OnLost | None
    hooks: LockHooks | None
    unreachable_timeout: UnreachableTimeout


class WaitKeywords(LeaseKeywords, total=False):
    """A lease's options and a waiter's (an election's candidates take these)."""

    timeout: float | None
    retry_base: float
    retry_cap: float


class RWLockKeywords(WaitKeywords, total=False):
    """A read-write lock's options: a lock's but ``fair`` (it always serves in turn)."""

    blocking: bool


class LockKeywords(RWLockKeywords, total=False):
    """A lock's and a semaphore's options."""

    fair: bool


class ManagerKeywords(LockKeywords, total=False):
    """A ``LockManager``'s defaults: a lock's options and its ``ttl``."""

    ttl: float


def names_of(keywords: type[Any]) -> frozenset[str]:
    """The option names a typed dictionary of keywords declares."""
    return frozenset(keywords.__required_keys__ | keywords.__optional_keys__)


LEASE_OPTIONS = names_of(LeaseKeywords)
WAIT_OPTIONS = names_of(WaitKeywords)
RWLOCK_OPTIONS = names_of(RWLockKeywords)
LOCK_OPTIONS = names_of(LockKeywords)


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
    on_lost: OnLost | None = None
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
        ttl = _validate.ttl(values["ttl"])
        blocking = _validate.flag(values["blocking"], "blocking")
        timeout = _validate.optional_timeout(values["timeout"])
        _validate.timeout_needs_blocking(blocking, timeout)
        safety_margin = values["safety_margin"]
        if safety_margin is not None:
            safety_margin = _validate.seconds(safety_margin, "safety_margin", allow_zero=True)
            if safety_margin >= ttl:
                raise ValueError(f"safety_margin ({safety_margin:g} s) must be smaller than ttl ({ttl:g} s)")
        heartbeat = values["heartbeat"]
        if not isinstance(heartbeat, bool):
            heartbeat = _validate.seconds(heartbeat, "heartbeat")
        on_lost = values["on_lost"]
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable, not {type(on_lost).__name__}")
        hooks = values["hooks"]
        if hooks is not None and not isinstance(hooks, LockHooks):
            raise TypeError(f"hooks must be a mongolock_async.LockHooks, not {type(hooks).__name__}")
        retry_base = _validate.seconds(values["retry_base"], "retry_base")
        options = cls(
            ttl=ttl,
            blocking=blocking,
            timeout=timeout,
            label=_validate.optional_label(values["label"]),
            write_concern=_validate.write_concern(values["write_concern"]),
            heartbeat=heartbeat,
            safety_margin=safety_margin,
            on_lost=on_lost,
            fair=_validate.flag(values["fair"], "fair"),
            hooks=hooks,
            retry_base=retry_base,
            retry_cap=_validate.seconds(values["retry_cap"], "retry_cap", minimum=retry_base),
            unreachable_timeout=_validate.unreachable_timeout(values["unreachable_timeout"]),
        )
        options.heartbeat_interval(ttl)  # a heartbeat that cannot fit raises now
        return options

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
