"""Web frameworks and tracing: FastAPI, aiohttp and OpenTelemetry, each behind its extra. Public
through ``mongolock_async.fastapi``, ``.aiohttp`` and ``.opentelemetry``."""
