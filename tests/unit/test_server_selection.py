"""How tests pick a server: MONGODB_URI, else testcontainers where Docker answers, else embedded."""

from __future__ import annotations

import os

import pytest
from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo, ServerChoice, docker_engine_answers, select_server
from mongolock_async.testing import selection as selection_module
from mongolock_async.testing.selection import mongodb_image


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


@pytest.mark.environment
def test_testcontainers_mongodb_when_docker_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    if not docker_engine_answers():
        if os.environ.get("MONGOLOCK_TEST_EXPECT_SERVER") == "testcontainers":
            pytest.fail("the workflow's testcontainers job found no Docker engine")
        pytest.skip("needs a Docker engine (none answers here): the workflow's testcontainers job runs it")
    monkeypatch.delenv("MONGODB_URI", raising=False)
    monkeypatch.setenv("MONGOLOCK_TEST_MONGODB_IMAGE", "mongo:7.0")
    with select_server() as choice:
        assert choice.kind == "testcontainers"
        with MongoClient(choice.uri) as client:
            # What the suite needs, and testcontainers' MongoDbContainer (a standalone server) lacks.
            hello = client.admin.command("hello")
            assert hello.get("setName") == "rs0" and hello.get("isWritablePrimary"), hello
            client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
            assert client.server_info()["version"].startswith("7.0."), "the image was not the one asked for"
            with client.mongolock_tests.selection.watch(max_await_time_ms=100) as stream:
                assert stream.try_next() is None  # change streams need a replica set
            with client.start_session() as session, session.start_transaction():
                client.mongolock_tests.selection.insert_one({"in": "a transaction"}, session=session)


def test_the_image_is_the_newest_supported_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONGOLOCK_TEST_MONGODB_IMAGE", raising=False)
    assert mongodb_image() == "mongo:8.0"
    monkeypatch.setenv("MONGOLOCK_TEST_MONGODB_IMAGE", "mongo:5.0")
    assert mongodb_image() == "mongo:5.0"


@pytest.mark.environment
def test_the_session_server_is_what_the_suite_needs(mongolock_server: ServerChoice) -> None:
    # The workflow's jobs say which server the suite must have run on: a green job on the wrong one
    # (the embedded server, where Docker was not found) would prove nothing about MongoDB.
    expected_kind = os.environ.get("MONGOLOCK_TEST_EXPECT_SERVER")
    if expected_kind:
        assert mongolock_server.kind == expected_kind
    with MongoClient(mongolock_server.uri, serverSelectionTimeoutMS=10_000) as client:
        hello = client.admin.command("hello")
        # Change streams and transactions: a replica set member, or a mongos.
        assert hello.get("setName") or hello.get("msg") == "isdbgrid", hello
        expected_version = os.environ.get("MONGOLOCK_TEST_EXPECT_VERSION")
        if expected_version:
            assert client.server_info()["version"].startswith(expected_version + "."), client.server_info()
        if mongolock_server.kind != "uri":  # servers the suite starts have the test commands
            client.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
