"""Sync SDK clients from docs/recipes against real local servers."""

from __future__ import annotations

import os

import sdk_net
from sdk_fork import Forked

THREADS = 32
JOIN = 60.0


def _race(sdk):
    """Release THREADS first calls together; return (clients, ports)."""
    clients, ports = [], []

    def first_call():
        client = sdk.singleton()
        clients.append(client)
        ports.append(sdk.use(client))

    assert [] == sdk_net.together(THREADS, first_call, JOIN)
    return clients, ports


class TestFirstCall:
    def test_racing_threads_build_one_client_and_one_pool(self, sdk):
        """32 threads calling first build one client; its pool is ours."""
        clients, ports = _race(sdk)
        assert 1 == sdk.singleton.statistics().builds
        assert all(c is clients[0] for c in clients)
        # Every connection the server saw is a socket of this process, or
        # one the pool already closed (beyond its size): none leaked, and
        # the one client's close ends all of them.
        ours = sdk.process_ports()
        assert ours
        assert [] == [p for p in ports if p not in ours and sdk.server_open(p)]
        assert sdk.singleton.reset()
        assert sdk_net.wait_until(
            lambda: not any(sdk.server_open(p) for p in set(ports))
        )
        assert not set(ports) & sdk.process_ports()


class TestRotation:
    def test_rotation_closes_the_old_connections(self, sdk):
        """A key change builds a new client and closes the old one's."""
        old = sdk.singleton()
        port = sdk.use(old)
        assert sdk.server_open(port)
        assert port in sdk.process_ports()
        sdk.rotate()
        new = sdk.singleton()
        assert new is not old
        stats = sdk.singleton.statistics()
        assert (2, 1, 0) == (stats.builds, stats.closes, stats.close_failures)
        assert sdk_net.wait_until(lambda: not sdk.server_open(port))
        assert port not in sdk.process_ports()
        assert port != sdk.use(new)

    def test_a_lease_keeps_the_client_usable_across_a_rotation(self, sdk):
        """A leased client still works after a rotation, then is closed."""
        with sdk.singleton.lease() as leased:
            port = sdk.use(leased)
            sdk.rotate()
            new = sdk.singleton()
            assert new is not leased
            assert 0 == sdk.singleton.statistics().closes
            assert 1 == sdk.singleton.statistics().pending_close
            assert port == sdk.use(leased)
            assert sdk.server_open(port)
        assert 1 == sdk.singleton.statistics().closes
        assert sdk_net.wait_until(lambda: not sdk.server_open(port))
        assert port != sdk.use(new)


class TestFork:
    def test_child_builds_its_own_and_leaves_the_parents(self, sdk):
        """A forked child builds and uses its own client; ours is intact."""
        parent_client = sdk.singleton()
        port = sdk.use(parent_client)

        def in_child():
            client = sdk.singleton()
            stats = sdk.singleton.statistics()
            return {
                "fresh": client is not parent_client,
                "port": sdk.use(client),
                "builds": stats.builds,
                "pid": stats.pid,
            }

        child = Forked(in_child)
        reply = child.result()
        assert 0 == child.finish()
        assert {"fresh": True, "builds": 1, "pid": child.pid} == {
            k: reply[k] for k in ("fresh", "builds", "pid")
        }
        assert port != reply["port"]
        assert sdk.singleton() is parent_client
        assert port == sdk.use(parent_client)
        assert sdk.server_open(port)
        assert 1 == sdk.singleton.statistics().builds
        assert os.getpid() == sdk.singleton.statistics().pid


class TestForkedChildLetsGo:
    def test_parent_close_reaches_the_server_while_a_child_lives(self, sdk):
        """With the recipe, a rotation's close is seen despite a live child."""
        port = sdk.use(sdk.singleton())
        child = Forked(lambda: None)
        try:
            child.result()
            assert port not in sdk.process_ports(child.pid)
            sdk.rotate()
            sdk.singleton()
            assert 1 == sdk.singleton.statistics().closes
            assert sdk_net.wait_until(lambda: not sdk.server_open(port))
        finally:
            assert 0 == child.finish()

    def test_without_release_a_live_child_holds_it_open(self, sdk):
        """Without after_fork=, the child's copies hold the connection.

        This pins the gap the recipes close. redis-py's close() shuts the
        socket down, which the server sees anyway; gRPC's sockets are not
        Python objects, and its fork support lets the child's copies go.
        """
        holds = sdk.python_sockets
        seen_closed = not holds or sdk.shuts_down
        single = sdk.plain()
        port = sdk.use(single())
        child = Forked(lambda: None)
        try:
            child.result()
            assert holds == (port in sdk.process_ports(child.pid))
            sdk.rotate(single)
            single()
            assert 1 == single.statistics().closes
            # Waiting out a close that never comes: half a second is plenty
            # on loopback; one that does come gets the usual 5 s.
            closed = sdk_net.wait_until(
                lambda: not sdk.server_open(port),
                timeout=5.0 if seen_closed else 0.5,
            )
            assert seen_closed is closed
        finally:
            assert 0 == child.finish()
        assert sdk_net.wait_until(lambda: not sdk.server_open(port))
