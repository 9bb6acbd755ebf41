"""The handles users hold: a lock, a semaphore, a read-write lock, an election, a job, and the
manager that makes them. Each is public through ``mongolock_async``; nothing here is imported by
the layers below (``_runtime``, ``admin``, ``store``, ``_util``)."""
