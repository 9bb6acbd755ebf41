"""How tests pick a server: MONGODB_URI, else testcontainers where Docker answers, else embedded."""

from __future__ import annotations

import pytest
from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo, docker_engine_answers, select_server
from mongolock_async.testing import selection as selection_module


def test_mongodb_uri_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    with EmbeddedMongo() as server:
        with MongoClient(server.uri) as client:
            client.db.marker.insert_one({"_id": "written-before-selection"})
        monkeypatch.setenv("MONGODB_URI", server.uri)
        # Were Docker or the embedded path taken instead, the marker would not be there.
        monkeypatch.setattr(selection_module, "docker_engine_answers", lambda: pytest.fail("Docker was probed"))
        with select_server() as choice:
            assert choice.kind == "uri"
            assert choice.uri == server.uri
            assert choice.embedded is None
            with MongoClient(choice.uri) as client:
                assert client.db.marker.find_one({"_id": "written-before-selection"}) is not None


def test_embedded_is_used_without_uri_or_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    monkeypatch.setattr(selection_module, "docker_engine_answers", lambda: False)
    with select_server() as choice:
        assert choice.kind == "embedded"
        assert choice.embedded is not None and choice.embedded.running
        with MongoClient(choice.uri) as client:
            assert client.admin.command("ping")["ok"] == 1
    assert not choice.embedded.running


def test_testcontainers_mongodb_when_docker_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    if not docker_engine_answers():
        pytest.skip("no Docker engine answers here, so the testcontainers MongoDB path cannot run")
    monkeypatch.delenv("MONGODB_URI", raising=False)
    with select_server() as choice:
        assert choice.kind == "testcontainers"
        with MongoClient(choice.uri) as client:
            assert client.admin.command("ping")["ok"] == 1
