"""Choosing the interface that routes to the main machine (accel_state.network)."""

import pytest

from accel_state.network import (
    CHOSEN_VARIABLES,
    IFNAME_VARIABLES,
    RouteChoice,
    address_of,
    choose_interface,
    interface_addresses,
    interface_of,
    is_this_machine,
    local_address,
    resolve,
    route_to,
    user_choice,
)


def test_the_users_setting_wins_whichever_backend_it_names():
    for name in IFNAME_VARIABLES:
        assert user_choice({name: "ib0"}) == {name: "ib0"}
        assert choose_interface("198.18.0.10", {name: "ib0"}) is None
    assert user_choice({"GLOO_SOCKET_IFNAME": ""}) == {}


def test_a_main_machine_reached_over_loopback_needs_no_choice():
    assert route_to("127.0.0.1") is None
    assert route_to("localhost") is None
    assert is_this_machine("127.0.0.1") and is_this_machine("localhost")


def test_a_host_that_resolves_nowhere_gets_no_choice():
    assert resolve("no-such-host.invalid") is None
    assert route_to("no-such-host.invalid") is None
    assert not is_this_machine("no-such-host.invalid")


def test_the_choice_sets_gloo_nccl_and_tensorpipe_and_says_which_route():
    choice = RouteChoice("eth0", "10.0.0.2", "10.0.0.1")
    assert choice.env() == dict.fromkeys(CHOSEN_VARIABLES, "eth0")
    assert choice.describe() == "eth0 (10.0.0.2), which routes to the main machine 10.0.0.1"
    toward = RouteChoice("eth0", "10.0.0.2", "10.0.0.1", toward="the lighthouse")
    assert toward.describe() == "eth0 (10.0.0.2), which routes to the lighthouse 10.0.0.1"


def test_the_address_of_a_named_interface_is_published_when_the_user_chose_one():
    addresses = interface_addresses()
    loopback = next(name for name, held in addresses.items() if "127.0.0.1" in held)
    assert interface_of("127.0.0.1") == loopback
    assert local_address("10.0.0.1", {"GLOO_SOCKET_IFNAME": loopback}) == "127.0.0.1"
    assert address_of("no-such-interface") is None


@pytest.mark.parametrize("value", ["^docker0", "=eth0", "eth0,eth1"])
def test_nccl_patterns_are_not_read_as_one_interface(value):
    # NCCL's "^exclude", "=exact" and lists name no single address; the route decides.
    assert local_address("127.0.0.1", {"NCCL_SOCKET_IFNAME": value}) is None
