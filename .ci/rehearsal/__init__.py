"""The rehearsal of the real-MongoDB workflow (see ``.ci/rehearse.py``)."""
