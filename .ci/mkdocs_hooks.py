"""MkDocs hooks: the site's header names the version, read from the package (written once, in
mongolock_async/_version.py)."""

from __future__ import annotations

from typing import Any

from mongolock_async import __version__


def on_config(config: Any) -> Any:
    config["site_name"] = f"mongolock-async {__version__}"
    return config
