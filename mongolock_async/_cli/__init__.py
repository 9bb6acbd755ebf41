"""The ``mongolock`` command: its parser and subcommands, the report and watch views, the deployment
check, and the demo."""
