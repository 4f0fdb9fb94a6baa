"""Worker hosts in network namespaces, for the multi-host fault tests (docs/design.md
§15).

Each host is a network namespace ``sdf-fencing-<name>`` joined to this (the test's)
namespace by a veth pair made here: ``sdf-fencing-h<i>`` on our side with
``10.231.<i>.1/24``, ``sdf-fencing-n<i>`` inside with ``10.231.<i>.2/24``. Those addresses
exist only on these links; the private PostgreSQL and the relay listen on the ``.1``
side, so a host reaches them over its own link and nothing else. Faults:

- :meth:`Host.cut` -- nft drop rules *inside the host's namespace* (table
  ``inet sdf_fencing``): silently dropped packets both ways, to some ports of our side or
  to all of it; :meth:`Host.heal` deletes the table;
- :meth:`Host.vanish` -- the link deleted: the host is gone without a FIN, and its
  sessions stay open on the server's side;
- :meth:`Host.freeze` / :meth:`Host.thaw` -- SIGSTOP / SIGCONT of its processes.

:class:`Network` tears everything down even when the test failed: its processes (by
pid), the links, the namespaces (their nft tables go with them). Nothing outside these
names and addresses is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

PREFIX = "sdf-fencing"
SUBNET = "10.231"
NFT_TABLE = "sdf_fencing"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True,
                          timeout=30)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    probe = f"{PREFIX}-probe"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class Host:
    """One worker host: a namespace, its link, its processes."""

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.netns = f"{PREFIX}-{name}"
        self.outer = f"{PREFIX}-h{index}"  # interface names: at most 15 characters
        self.inner = f"{PREFIX}-n{index}"
        self.gateway = f"{SUBNET}.{index}.1"  # our side: the database and the relay
        self.address = f"{SUBNET}.{index}.2"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.frozen = False

    # --- making and unmaking ----------------------------------------------------------

    def create(self) -> None:
        _run("ip", "netns", "add", self.netns)
        _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        _run("ip", "link", "set", self.inner, "netns", self.netns)
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.outer)
        _run("ip", "link", "set", self.outer, "up")
        self.exec("ip", "addr", "add", f"{self.address}/24", "dev", self.inner)
        self.exec("ip", "link", "set", self.inner, "up")
        self.exec("ip", "link", "set", "lo", "up")

    def destroy(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        _run("ip", "link", "del", self.outer, check=False)
        _run("ip", "netns", "del", self.netns, check=False)

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", self.netns, *argv, check=check)

    def spawn(self, argv: Sequence[str], env: dict[str, str],
              log: IO[bytes], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """A process in this host's namespace (``ip netns exec`` execs it: same pid)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        self.procs.append(proc)
        return proc

    # --- faults -----------------------------------------------------------------------

    def cut(self, ports: Sequence[int] | None = None) -> None:
        """Drop every packet between this host and our side (only to/from ``ports`` of
        ours when given), both ways, without a reset: a network that went silent."""
        match = ""
        if ports:
            match = "tcp dport { " + ", ".join(map(str, ports)) + " } "
        back = match.replace("dport", "sport")
        rules = (f"table inet {NFT_TABLE} {{\n"
                 f"  chain out {{ type filter hook output priority 0; policy accept;\n"
                 f"    ip daddr {self.gateway} {match}drop\n  }}\n"
                 f"  chain in {{ type filter hook input priority 0; policy accept;\n"
                 f"    ip saddr {self.gateway} {back}drop\n  }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", self.netns, "nft", "-f", "-"], input=rules,
                       text=True, check=True, capture_output=True, timeout=30)

    def heal(self) -> None:
        self.exec("nft", "delete", "table", "inet", NFT_TABLE, check=False)

    def vanish(self) -> None:
        """The link is deleted (both ends): the host is gone for good, without a FIN."""
        _run("ip", "link", "del", self.outer)

    def freeze(self) -> None:
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGCONT)
        self.frozen = False


class Network:
    """The hosts of one test; :meth:`close` removes all of it."""

    def __init__(self, names: Sequence[str]) -> None:
        self.hosts = {name: Host(name, i + 1) for i, name in enumerate(names)}

    def __enter__(self) -> Network:
        try:
            for host in self.hosts.values():
                host.destroy()  # leftovers of a run that was killed before its teardown
                host.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts.values():
            host.destroy()

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def gateways(self) -> list[str]:
        return [h.gateway for h in self.hosts.values()]
