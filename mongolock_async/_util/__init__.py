"""Helpers that know nothing of locks: bounded requests that finish when their caller is cancelled,
error diagnosis, weak maps, backoff, argument validation, the collection's duck type, printable text
and child processes."""
