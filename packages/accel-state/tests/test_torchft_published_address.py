"""create_replica_manager(address=...): what torchft publishes to the other replica groups.

A real lighthouse and a real torchft Manager (needs torchft: skipped without it). Groups on other
machines reach this group's manager and healing copies at the published address; torchft's own
choice is the hostname, which may resolve nowhere (or to 127.0.1.1).
"""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("torchft")

from accel_state.torchft_api import (
    ReplicaManager,
    create_replica_manager,
    start_lighthouse,
)

#: A loopback address other than 127.0.0.1 (Linux routes all of 127/8 to loopback), so that
#: the test sees the address it gave, not one torchft or the store would pick themselves.
ADDRESS = "127.0.0.2"


def manager_at(address: str | None, lighthouse: str) -> ReplicaManager:
    """A one-process group's replica manager publishing ``address``."""
    return create_replica_manager(
        device_type="cpu",
        group_rank=0,
        group_size=1,
        replica_id=0,
        min_replicas=1,
        lighthouse=lighthouse,
        timeout_s=10,
        quorum_timeout_s=10,
        connect_timeout_s=10,
        state_dict=dict,
        load_state_dict=lambda state: None,
        address=address,
    )


def test_the_given_address_is_published_for_the_manager_and_the_healing_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # the store's host defaults to loopback
    monkeypatch.delenv("TORCHFT_TIMEOUT_SEC", raising=False)
    lighthouse = start_lighthouse("127.0.0.1", 0, min_replicas=1)
    try:
        published = manager_at(ADDRESS, lighthouse.address)
        try:
            inner = published._manager
            assert inner._manager.address().startswith(f"http://{ADDRESS}:")
            assert inner._checkpoint_transport.metadata().startswith(f"http://{ADDRESS}:")
            published.start_step()  # a quorum over the published addresses
            assert published.participants == 1
        finally:
            published.shutdown()
        default = manager_at(None, lighthouse.address)
        try:
            metadata = default._manager._checkpoint_transport.metadata()
            assert metadata.startswith(f"http://{socket.gethostname()}:")  # torchft's own choice
        finally:
            default.shutdown()
    finally:
        lighthouse.shutdown()
