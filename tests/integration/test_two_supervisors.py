"""Two supervisors on one engine, with the same sandbox keys, never touch each other's
containers: each container carries its supervisor's instance id in its labels and name;
listing, destroying, restarting (adoption) and the sweep of one instance leave the other's
containers running, with the same ids."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from stockade.supervisor.cli import launcher
from tests.integration.harness import (
    Supervisor,
    engine_url,
    instance_containers,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(600)

KEYS = ("shared-a", "shared-b")


@pytest.fixture
def pair(engine: str) -> Iterator[tuple[Supervisor, Supervisor]]:
    with running_supervisor(engine) as one, running_supervisor(engine) as two:
        yield one, two


def containers(sup: Supervisor) -> dict[str, str]:
    """key -> container id, as the supervisor lists them."""
    with sup.client() as c:
        return {s.key: s.container_id for s in c.list_sandboxes() if s.container_id}


def test_same_keys_two_supervisors_stay_apart(pair: tuple[Supervisor, Supervisor]) -> None:
    one, two = pair
    assert one.instance_id() != two.instance_id()
    for sup, mark in ((one, "one"), (two, "two")):
        with sup.client() as c:
            for key in KEYS:
                c.sandbox(key).write_file("who.txt", mark)
    with two.client() as c:
        c.sandbox("only-two").exec("true")
    ids_one, ids_two = containers(one), containers(two)
    assert set(ids_one) == set(KEYS)  # the other's key is not listed here
    assert set(ids_two) == {*KEYS, "only-two"}
    assert not set(ids_one.values()) & set(ids_two.values())
    engine = one.engine
    for sup, ids in ((one, ids_one), (two, ids_two)):
        found = {c.id: c for c in instance_containers(engine, engine_url(engine), sup)}
        assert set(found) == set(ids.values())
        for info in found.values():
            assert info.labels["io.stockade.instance"] == sup.instance_id()
            assert sup.instance_id()[:8] in info.name
    for sup, mark in ((one, "one"), (two, "two")):
        with sup.client() as c:
            for key in KEYS:
                assert c.sandbox(key).read_file("who.txt") == mark

    # destroying a key in one leaves the other's sandbox of the same key running
    with one.client() as c:
        assert c.destroy_sandbox("shared-a", delete_workspace=True)
    assert containers(two) == ids_two
    with two.client() as c:
        assert c.sandbox("shared-a").read_file("who.txt") == "two"
    assert containers(two) == ids_two

    # a restart of one adopts only its own containers and removes none of the other's
    one.stop(signal.SIGKILL)
    one.start()
    assert containers(one) == {"shared-b": ids_one["shared-b"]}
    assert "adopted 1 running sandbox(es)" in one.log()
    assert containers(two) == ids_two
    with two.client() as c:
        for key in KEYS:
            assert c.sandbox(key).read_file("who.txt") == "two"
    assert containers(two) == ids_two

    # the sweep of one instance (what cleanup does) leaves the other's containers
    one.stop()
    assert launcher.remove_instance_containers(engine, engine_url(engine), one.state_dir) == 1
    assert {c.id for c in instance_containers(engine, engine_url(engine), two)} == set(
        ids_two.values()
    )
    with two.client() as c:
        assert c.sandbox("only-two").exec("echo alive").stdout == "alive\n"
    assert containers(two) == ids_two
