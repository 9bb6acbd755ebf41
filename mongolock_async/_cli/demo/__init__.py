"""``mongolock demo``: the story it tells on an embedded server, and the worker processes it starts."""
