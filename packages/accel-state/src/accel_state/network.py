"""Which network interface reaches the main machine, for the backends' ``*_SOCKET_IFNAME`` variables.

gloo and NCCL pick the address they advertise to their peers from the machine's hostname unless
told an interface. Where the hostname resolves to nothing, or to 127.0.1.1 (as the hosts file of
Debian and Ubuntu installations has it), they advertise the loopback address and the other
machines cannot connect ("Gloo connectFullMesh failed ... Connection refused, remote=[127.0.0.1]").
The interface that matters is the one whose address routes to the main machine: the kernel tells
which when a UDP socket is connected to that address (no packet is sent), and the interfaces'
addresses (:func:`interface_addresses`) map the source address it chose back to a name.

The user's own setting always wins: when any of :data:`IFNAME_VARIABLES` is set, nothing is chosen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no interface lookup, nothing is chosen
    fcntl = None  # type: ignore[assignment]

#: The variables that name the interface a backend uses, for gloo, NCCL, TensorPipe (RPC) and
#: oneCCL. Any one set by the user means they chose: accel sets none of them then.
IFNAME_VARIABLES = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "CCL_SOCKET_IFNAME",
)
#: What accel sets when it chooses: gloo, NCCL and TensorPipe read a plain interface name.
CHOSEN_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
_ANY_PORT = 9  # the discard port: connecting a UDP socket sends nothing
_SIOCGIFADDR = 0x8915  # Linux's ioctl for an interface's IPv4 address


@dataclasses.dataclass(frozen=True)
class RouteChoice:
    """The interface whose address routes to the main machine (or another machine named).

    Attributes:
        interface: Its name (``eth0``).
        address: Its address on that route (what peers will connect to).
        main_address: The address of the machine it was chosen for.
        toward: What that machine is, for :meth:`describe` (``the lighthouse``...).
    """

    interface: str
    address: str
    main_address: str
    toward: str = "the main machine"

    def env(self) -> dict[str, str]:
        """The variables to set for the backends (each :data:`CHOSEN_VARIABLES` -> interface)."""
        return dict.fromkeys(CHOSEN_VARIABLES, self.interface)

    def describe(self) -> str:
        """``eth0 (198.18.0.11), which routes to the main machine 198.18.0.10``."""
        return (
            f"{self.interface} ({self.address}), which routes to {self.toward} {self.main_address}"
        )


def user_choice(environ: Mapping[str, str]) -> dict[str, str]:
    """The interface variables the user set (empty when none)."""
    return {name: environ[name] for name in IFNAME_VARIABLES if environ.get(name)}


def resolve(host: str) -> str | None:
    """``host``'s IPv4 address (IPv6 when it has none), or None when it resolves to nothing."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    addresses = [str(info[4][0]) for info in infos]
    ipv4 = [address for address in addresses if ":" not in address]
    chosen = ipv4 or addresses
    return chosen[0] if chosen else None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def source_address(destination: str) -> str | None:
    """The local address the kernel would send from to reach ``destination`` (None: no route)."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((destination, _ANY_PORT))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its addresses (IPv4 first), read from the kernel (Linux; else empty).

    IPv4 addresses come from ``SIOCGIFADDR`` per interface of :func:`socket.if_nameindex`, IPv6
    ones from ``/proc/net/if_inet6``. accel-state depends on torch only, so this is not psutil.
    """
    found: dict[str, list[str]] = {}
    if fcntl is None:
        return found
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address
                continue
            found.setdefault(name, []).append(socket.inet_ntoa(reply[20:24]))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            fields = line.split()
            if len(fields) == 6:
                packed = bytes.fromhex(fields[0])
                found.setdefault(fields[5], []).append(socket.inet_ntop(socket.AF_INET6, packed))
    return found


def interface_of(address: str) -> str | None:
    """The name of the interface holding ``address`` (None when no interface holds it)."""
    wanted = address.split("%")[0]
    for name, addresses in interface_addresses().items():
        if wanted in addresses:
            return name
    return None


def address_of(interface: str) -> str | None:
    """``interface``'s first IPv4 address (IPv6 when it has none); None for an unknown name."""
    addresses = interface_addresses().get(interface, [])
    return addresses[0] if addresses else None


def is_this_machine(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address or to an address of this machine's."""
    address = resolve(host)
    if address is None:
        return False
    return _is_loopback(address) or interface_of(address) is not None


def route_to(main_host: str) -> RouteChoice | None:
    """The interface that reaches ``main_host``; None for a loopback route or an unknown host.

    A loopback route means every process is on this machine, where the backends' own choice
    works.
    """
    main_address = resolve(main_host)
    if main_address is None or _is_loopback(main_address):
        return None
    source = source_address(main_address)
    if source is None or _is_loopback(source):
        return None
    interface = interface_of(source)
    if interface is None:
        return None
    return RouteChoice(interface, source, main_address)


def choose_interface(main_host: str, environ: Mapping[str, str]) -> RouteChoice | None:
    """The interface to set for a job whose main machine is ``main_host``; None to set nothing.

    Nothing is chosen when the user set one of :data:`IFNAME_VARIABLES` or when the main machine
    is reached over loopback.
    """
    if user_choice(environ):
        return None
    return route_to(main_host)


def local_address(main_host: str, environ: Mapping[str, str]) -> str | None:
    """This machine's address as the other machines reach it, for the rendezvous to publish.

    The address of the interface the user named (the first of :data:`IFNAME_VARIABLES` set, when
    it is one interface), else of the interface that routes to ``main_host``; None when neither
    is known (the rendezvous then publishes the hostname, as torch does).
    """
    for name in IFNAME_VARIABLES:
        value = environ.get(name, "")
        if value and "," not in value and not value.startswith(("^", "=")):
            found = address_of(value)
            if found is not None:
                return found
    choice = route_to(main_host)
    return None if choice is None else choice.address
