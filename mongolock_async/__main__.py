"""``python -m mongolock_async``: the same as the ``mongolock`` command."""

from .cli import main

main()
