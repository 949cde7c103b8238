"""Which machines run the ranks and the NCCL settings they get: ``launch:``."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Optional

from bloomline.config import Location, check

BLOOM_NCCL_ENV = {"NCCL_ASYNC_ERROR_HANDLING": "1"}
_HOST = re.compile(
    r"(?=[^\n]{1,253}\Z)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)
"""A host name (RFC 1123 labels; ``_`` taken, as some clusters name nodes with it)."""
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")


def is_host(value: str) -> bool:
    """Whether ``value`` is a host name or an IP address, and nothing more (no space, no line break:
    DeepSpeed's launcher writes it into an environment file one variable a line)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(_HOST.fullmatch(value))


LAUNCHERS = ("pdsh", "openmpi", "slurm", "mpich", "impi", "mvapich")


@dataclass
class LaunchConfig:
    """Where the ranks run: one node (default) or several, started by DeepSpeed's launcher
    (docs/train.md, "Training on several nodes"). Not part of what a run computes: the same run
    may resume on other machines."""

    hostfile: Optional[Location] = None
    """DeepSpeed hostfile (``host slots=N`` per line); None: the machine the command runs on, tp·pp·dp local ranks."""
    launcher: str = "pdsh"
    """How DeepSpeed reaches the other nodes: pdsh (ssh), openmpi, slurm (srun), mpich, impi, mvapich."""
    launcher_args: str = ""
    """Extra arguments for that launcher (``srun``'s ``--partition=...``, ``mpirun``'s ``--bind-to none``)."""
    master_addr: Optional[str] = None
    """Address of the first node, where rank 0's rendezvous listens; None: the hostfile's first host
    (DeepSpeed asks it over ssh), 127.0.0.1 on one node."""
    master_port: Optional[int] = None
    """Rendezvous port; None: a free port on one node, 29500 on several (every node must use the same)."""
    no_ssh: bool = False
    """Start only this node's ranks (``node_rank``); run the same command on every node (no ssh needed)."""
    node_rank: int = 0
    """This node's index in the hostfile, with ``no_ssh``."""
    nccl: dict[str, str] = field(default_factory=lambda: dict(BLOOM_NCCL_ENV))
    """NCCL_* variables set for every rank on every node (DeepSpeed's launcher exports them); BLOOM's by default."""

    @property
    def worker_node(self) -> bool:
        """A node other than the first, started on its own (``no_ssh``): it hosts ranks, nothing
        else (the job's flow run, evaluations and checkpoints belong to the first node)."""
        return self.no_ssh and self.node_rank > 0

    def validate(self) -> None:
        check(self.launcher in LAUNCHERS, "launcher", f"'{self.launcher}': use one of {', '.join(LAUNCHERS)}")
        check(
            all(_NCCL_NAME.fullmatch(k) for k in self.nccl),
            "nccl",
            f"only NCCL_* variables belong here, got {sorted(k for k in self.nccl if not _NCCL_NAME.fullmatch(k))}",
        )
        bad = sorted(k for k, v in self.nccl.items() if re.search(r"[\r\n\0]", str(v)))
        check(
            not bad,
            "nccl",
            f"{bad[0] if bad else ''}: a value holds a line break or NUL (each is one line of DeepSpeed's environment file)",
        )
        check(
            self.master_addr is None or is_host(self.master_addr),
            "master_addr",
            f"{json.dumps(self.master_addr)} is not a host name or an IP address",
        )
        check(self.master_port is None or 0 < self.master_port < 65536, "master_port", "must be in 1..65535")
        check(self.node_rank >= 0, "node_rank", "must be >= 0")
        check(not self.no_ssh or self.hostfile is not None, "no_ssh", "needs a hostfile (which node is which)")
