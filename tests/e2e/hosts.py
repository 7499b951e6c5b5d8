"""Other hosts on this machine, for tests of what crosses a network (issue 24, item 4).

A :class:`Network` is a Linux bridge with the address ``10.231.N.1/24`` on this machine's side (N
random, checked free) and, for each :meth:`Network.host`, a network namespace joined to it by a
veth pair: ``eth0`` inside with ``10.231.N.(10+k)/24``, ``lo`` up, and no other route, so from a
host only the bridge's subnet is reachable, never this machine's loopback. What a host may reach
on this machine is what a :class:`Forwarder` listens for on the bridge address: a TCP port
forwarded to a service that binds loopback (Postgres, NATS, storage, credits), as a router or a
Kubernetes Service would put it in front of them.

:meth:`Host.popen` starts a command in the host's namespace with a filesystem root of its own
(:mod:`tests.e2e.hostroot`). Needs root and iproute2 (the Makefile's Debian packages; CI runs as
root); everything made is removed by :meth:`Network.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HOSTROOT = Path(__file__).with_name("hostroot.py")
ROOTS = Path("/run/hm-hosts")
"""Where each host's root is mounted, in its own mount namespace (the directory stays empty here)."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], check=True, capture_output=True, text=True).stdout
    return [
        ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
        for link in json.loads(out)
        for a in link.get("addr_info", [])
    ]


@dataclass
class Host:
    """One network namespace on the bridge: ``name`` (its netns), ``address`` (its ``eth0``)."""

    network: Network
    name: str
    address: str

    def popen(
        self,
        argv: list[str],
        env: Mapping[str, str],
        *,
        read_only: list[str],
        files: Mapping[str, str] | None = None,
        dirs: list[str] | None = None,
        **popen_args: Any,
    ) -> subprocess.Popen[bytes]:
        """``argv`` in this host's network namespace, with its name as hostname (a UTS namespace),
        as pid 1 of a PID namespace and in a root of its own (:mod:`hostroot`): ``read_only``
        paths bound read-only at the same place, ``files`` (path in the root → file here)
        copied in, ``dirs`` made. ``env`` is the whole environment it gets. The Popen's process
        passes SIGTERM, SIGINT and SIGHUP on to ``argv`` and exits as it does; killing it kills
        ``argv``."""
        spec = {
            "root": str(ROOTS / self.name),
            "hostname": self.name,
            "read_only": read_only,
            "files": dict(files or {}),
            "dirs": list(dirs or []),
        }
        launcher = [
            "nsenter",
            f"--net=/run/netns/{self.name}",
            "--",
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "--",
            sys.executable,
            str(HOSTROOT),
            json.dumps(spec),
            "--",
        ]
        return subprocess.Popen([*launcher, *argv], env=dict(env), **popen_args)

    def run(self, argv: list[str], env: Mapping[str, str], read_only: list[str], timeout: float = 60) -> str:
        """:meth:`popen` to the end; its stdout (stderr after it), AssertionError if it failed."""
        proc = self.popen(
            argv, env, read_only=read_only, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/"
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        text = out.decode(errors="replace")
        assert proc.returncode == 0, f"{argv} on {self.name} exited {proc.returncode}:\n{text[-3000:]}"
        return text


@dataclass
class Network:
    """A bridge and its hosts; a context manager that removes them all."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: ipaddress.IPv4Network = field(init=False)
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        used = _used_networks()
        for _ in range(100):
            candidate = ipaddress.ip_network(f"10.231.{secrets.randbelow(250) + 1}.0/24")
            if not any(candidate.overlaps(net) for net in used):
                self.subnet = candidate
                break
        else:
            raise RuntimeError("no free 10.231.N.0/24 for a test network")
        self.bridge = f"hmbr{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge, where :class:`Forwarder` listens."""
        return str(self.subnet.network_address + 1)

    def host(self) -> Host:
        """A new host on the bridge (its netns, veth pair and address)."""
        k = len(self.hosts)
        name = f"hm{self.tag}h{k}"
        address = str(self.subnet.network_address + 10 + k)
        _ip("netns", "add", name)
        host = Host(self, name, address)
        self.hosts.append(host)  # removed by close() from here on, whatever fails below
        _ip("link", "add", f"hmv{self.tag}{k}", "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("link", "set", f"hmv{self.tag}{k}", "master", self.bridge, "up")
        _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", name, "link", "set", "eth0", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Delete every host's namespace (and so its veth pair), its root's empty mount point, and
        the bridge; each step is tried whatever the others did."""
        for host in self.hosts:
            with contextlib.suppress(subprocess.SubprocessError):
                _ip("netns", "delete", host.name)
            with contextlib.suppress(OSError):
                (ROOTS / host.name).rmdir()
        with contextlib.suppress(subprocess.SubprocessError):
            _ip("link", "delete", self.bridge)
        with contextlib.suppress(OSError):
            ROOTS.rmdir()  # only when no other network's host is left

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Forwarder:
    """TCP forwarding from ``listen_host:port`` to upstreams on this machine, in a thread of its
    own: :meth:`add` returns the port it listens on for an upstream (``host:port``, a Unix socket's
    path, or None to be given later with :meth:`point`, for a port only known once the platform
    is up)."""

    def __init__(self, listen_host: str) -> None:
        self.listen_host = listen_host
        self._upstreams: dict[int, str | None] = {}
        self._servers: list[asyncio.Server] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="forwarder", daemon=True)
        self._thread.start()

    def add(self, upstream: str | None) -> int:
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.listen_host, 0), self._loop
        ).result(10)
        port = int(server.sockets[0].getsockname()[1])
        self._upstreams[port] = upstream
        self._servers.append(server)
        return port

    def point(self, port: int, upstream: str) -> None:
        self._upstreams[port] = upstream

    def address(self, port: int) -> str:
        return f"{self.listen_host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = self._upstreams.get(int(writer.get_extra_info("sockname")[1]))
        if upstream is None:
            log.warning(
                "forwarder %s: a connection before its upstream was given", writer.get_extra_info("sockname")
            )
            writer.close()
            return
        try:
            if upstream.startswith("/"):
                up_reader, up_writer = await asyncio.open_unix_connection(upstream)
            else:
                host, _, port = upstream.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError as exc:
            log.warning("forwarder: %s unreachable: %s", upstream, exc)
            writer.close()
            return
        ends = (writer, up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, ends), self._pipe(up_reader, writer, ends))
        finally:
            for end in ends:
                end.transport.abort()

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: tuple[asyncio.StreamWriter, ...]
    ) -> None:
        """One direction until its end of file, passed on as a half close; an error on either
        side (a reset, a broken pipe) aborts both connections, so the other direction ends too."""
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            for end in ends:
                end.transport.abort()

    def close(self) -> None:
        """Stop listening, abort the connections still open and stop the thread."""

        async def shutdown() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
