"""The ranks' rendezvous (training/parallel/rendezvous.py): rank 0's store listens on MASTER_ADDR
only, and the ranks meet through it."""

import threading
from datetime import timedelta

import psutil
from torch.distributed.rendezvous import rendezvous

from training.loop.launch import free_port
from training.parallel.rendezvous import INIT_METHOD


def listening_on(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port}


def test_rank_0s_store_listens_on_the_launch_address_only(monkeypatch):
    """torch's env:// store listened on every interface (``*:PORT``) for a one-node job whose
    launcher said 127.0.0.1: reachable from the network for the whole run."""
    port = free_port()
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    timeout = timedelta(seconds=20)
    got = {}
    # rank 0's store waits for rank 1 to connect: each in its own thread, as two processes would
    ranks = [
        threading.Thread(
            target=lambda r=r: got.update({r: next(rendezvous(f"{INIT_METHOD}?rank={r}", timeout=timeout))})
        )
        for r in (0, 1)
    ]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join(timeout=30)
    assert sorted(got) == [0, 1] and [got[r][1:] for r in (0, 1)] == [(0, 2), (1, 2)]
    assert listening_on(port) == {"127.0.0.1"}
    got[0][0].set("from-0", "hello")
    assert got[1][0].get("from-0") == b"hello"  # the ranks meet through it
