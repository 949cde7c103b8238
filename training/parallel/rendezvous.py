"""How the ranks find each other: torch's ``env://`` rendezvous, with rank 0's store listening
only on the launch's address.

torch's ``env://`` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) makes rank 0 host the job's
TCPStore, and on torch 2.13 that store listens on every interface (``*:MASTER_PORT``, IPv4 and
IPv6) whatever MASTER_ADDR says: seen with ``ss -ltn`` for ``TCPStore("127.0.0.1", ...)``, the
libuv store and the older one alike. A one-node job, whose launcher says 127.0.0.1, was so
reachable from the network for its whole run, and the store takes writes from anyone: the keys
the ranks exchange to connect (gloo's and NCCL's peer addresses), barriers, the job's progress.

``bloomline://`` (:data:`INIT_METHOD`) is ``env://`` except that rank 0's store serves a socket
bound here to MASTER_ADDR and handed to torch (``TCPStore(master_listen_fd=...)``, torch's own
option for a listening socket made by its caller). A MASTER_ADDR that is a host name rather than
an address is left to torch: a name can resolve to another address on this node than on the
others (Debian maps the host's name to 127.0.1.1), and binding there would lock them out. So is
an address this node does not hold (behind NAT), and an agent-hosted store (torchelastic).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from datetime import timedelta
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler, rendezvous

SCHEME = "bloomline"
INIT_METHOD = f"{SCHEME}://"
"""The ``init_method`` of the ranks' process group (``deepspeed.init_distributed``)."""


def listen_on(addr: str, port: int) -> socket.socket | None:
    """A listening TCP socket on ``addr:port``, or None when ``addr`` is no IP address or is not
    one of this node's (EADDRNOTAVAIL); any other failure (the port in use) is raised."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
    except ValueError:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as torch's own store: a restart may bind the port while the last attempt's
        # connections are still in TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        if e.errno == 99:  # EADDRNOTAVAIL
            return None
        raise
    return sock


def _handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[Any]:
    query = dict(parse_qsl(urlparse(url).query))
    rank = int(query.get("rank", os.environ.get("RANK", -1)))
    addr = os.environ.get("MASTER_ADDR", "")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    sock = None
    if rank == 0 and not agent and addr and os.environ.get("MASTER_PORT"):
        sock = listen_on(addr, int(os.environ["MASTER_PORT"]))
        if sock is None:
            try:
                ipaddress.ip_address(addr)
                why = "is not an address of this node"
            except ValueError:
                why = "is a host name, not an address"
            print(
                f"rendezvous: MASTER_ADDR={addr} {why}; torch's store listens on every interface "
                f"(give --master-addr this node's address to bind it there)",
                file=sys.stderr,
            )
    if sock is None:
        yield from rendezvous(f"env://?{urlparse(url).query}".rstrip("?"), timeout=timeout, **kwargs)
        return
    world = int(query.get("world_size", os.environ["WORLD_SIZE"]))
    port = sock.getsockname()[1]
    # the store owns the descriptor from here (libuv's store: the default on Linux, and the one
    # that takes a listening socket)
    store = dist.TCPStore(addr, port, world, True, timeout=timeout, master_listen_fd=sock.detach(), use_libuv=True)
    yield store, rank, world
    raise RuntimeError(f"{SCHEME}:// cannot rendezvous again (as env://)")


register_rendezvous_handler(SCHEME, _handler)
