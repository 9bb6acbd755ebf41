"""``python -m mongolock_async``: the same as the ``mongolock`` command."""

from ._cli.main import main

main()
