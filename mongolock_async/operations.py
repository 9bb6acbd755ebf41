"""What ``mongolock list``, ``inspect`` and ``release --force`` show and do, as typed functions of
a lock collection: for a health endpoint, an admin page or a script, without shelling out. The
command, ``mongolock watch`` and the dashboard are built on them.

```python
from mongolock_async.operations import list_locks

for lock in await list_locks(collection, held=True):
    print(lock.name, lock.summary, [holder.describe() for holder in lock.holders])
```

Every function checks its arguments before any I/O (``TypeError``/``ValueError`` naming the
argument) and reads with read concern ``majority``, judging leases on the server's clock. Reading
needs MongoDB's ``find`` action on the collection (the built-in ``read`` role has it);
[`force_release`][mongolock_async.operations.force_release] also needs ``update``.
"""

from .admin.operations import (
    ForcedRelease,
    Holder,
    LockInfo,
    Waiter,
    force_release,
    inspect_lock,
    judged_report,
    list_locks,
    lock_info,
    report_at,
)

__all__ = [
    "force_release",
    "ForcedRelease",
    "Holder",
    "inspect_lock",
    "judged_report",
    "list_locks",
    "lock_info",
    "LockInfo",
    "report_at",
    "Waiter",
]
