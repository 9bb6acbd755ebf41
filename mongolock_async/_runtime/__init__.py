"""The machinery under the handles: a held lease and its loss, the keeper that renews leases,
waiting in line for a name, and the watcher that wakes waiters when a lease is released."""
