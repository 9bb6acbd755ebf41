"""Operator tools: listing, inspecting and force-releasing locks, the live view, the dashboard, the
privileges each role needs, and the idle-cleanup index. Public through ``mongolock_async.operations``,
``.live``, ``.dashboard``, ``.privileges`` and ``mongolock_async.ensure_idle_cleanup_index``;
``LockManager`` imports these lazily, so ``import mongolock_async`` loads no console."""
