"""``mongolock check``: the verdicts, the run that gathers them, the deployment's topology and
clocks, and the sustained-load probe."""
