"""Webhook signing secrets in the Standard Webhooks format (https://www.standardwebhooks.com/),
and the checks that keep webhooks off private networks (SSRF): :func:`literal_private_host` when a
job is created, :func:`public_addresses` when a delivery is sent."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import asyncpg


def new_webhook_secret() -> str:
    """A signing secret: ``whsec_`` + base64 of 24 random bytes (192 bits)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


async def account_secret(pool: asyncpg.Pool, account_id: object) -> str:
    """The account's signing secret, created on first use for accounts made before there were any
    (concurrent first uses agree: the UPDATE keeps whichever secret was stored first)."""
    return str(
        await pool.fetchval(
            "UPDATE accounts SET webhook_secret = coalesce(webhook_secret, $2) WHERE account_id = $1 "
            "RETURNING webhook_secret",
            account_id,
            new_webhook_secret(),
        )
    )


class BlockedAddress(ValueError):
    """A webhook URL's host is, or resolves to, an address that is not public (SSRF guard)."""


NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): its last 32 bits are an IPv4 address."""

NEVER_PUBLIC = tuple(
    ipaddress.ip_network(network)
    for network in (
        # IANA IPv4 Special-Purpose Address Registry (RFC 6890 and later) and multicast/class E.
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        # IPv6: unspecified, loopback and IPv4-compatible (::/96), SIIT (RFC 6052/7915), local-use
        # NAT64 (RFC 8215), discard (RFC 6666), IETF protocol assignments with Teredo (2001::/23),
        # documentation, unique local, link-local, deprecated site-local (RFC 3879), multicast.
        "::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
"""Networks refused whatever :attr:`ipaddress.IPv4Address.is_global` says: its table changed
between Python patch releases (3.11.10 added 192.0.0.0/24 and 64:ff9b:1::/48, CVE-2024-4032), and
a check must not depend on the interpreter an image was built with."""


def is_public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is public unicast: in none of :data:`NEVER_PUBLIC` (loopback, private,
    link-local (169.254.0.0/16, cloud metadata; 192.0.0.192, Oracle's), shared 100.64.0.0/10,
    reserved, multicast, …) and :attr:`~ipaddress.IPv4Address.is_global`. An IPv4 address inside
    IPv6 (IPv4-mapped ``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is judged as
    the IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64_PREFIX:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(embedded)
    if any(address in network for network in NEVER_PUBLIC if network.version == address.version):
        return False
    return address.is_global and not address.is_multicast


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address without its IPv6 zone (``fe80::1%eth0``). Raises ValueError."""
    return ipaddress.ip_address(text.split("%", 1)[0])


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
"""Names a Debian ``/etc/hosts`` gives the loopback addresses (besides ``*.localhost``)."""


def literal_private_host(host: str) -> bool:
    """Whether a URL's host names a non-public address without DNS: an IP literal that is not
    :func:`is_public_address` (brackets, an IPv6 zone and the short IPv4 forms ``inet_aton`` reads
    allowed), one of :data:`LOOPBACK_NAMES` or a name under ``.localhost`` (RFC 6761). Give it the
    host as httpx parses it (``httpx.URL(url).host``: full-width and ideographic dots become
    dots), the form the reaper resolves. Other names are judged when delivered (:func:`public_addresses`)."""
    name = host.strip("[]").rstrip(".").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = _address(name)
    except ValueError:
        try:  # the forms getaddrinfo also reads as IPv4: 127.1, 2130706433, 0x7f.0.0.1
            address = ipaddress.IPv4Address(socket.inet_aton(name))
        except (OSError, ValueError):  # not such a form; a lone surrogate is a UnicodeEncodeError
            return False
    return not is_public_address(address)


RESOLVER_THREADS = 8
"""Threads that run the webhooks' ``getaddrinfo`` calls: their own pool, so that receivers whose
name servers never answer (glibc waits ~30 s) hold these threads, not the event loop's default
executor that the rest of the process uses."""

_resolver = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="webhook-dns")
"""Starts no thread until the first lookup (only the reaper makes any)."""


async def public_addresses(host: str, port: int) -> list[str]:
    """The addresses a webhook to ``host:port`` may connect to: ``getaddrinfo``'s TCP answers, in
    its order and without repeats, when every one is public. ``host`` is the ASCII (IDNA) form that
    is also sent in ``Host`` and TLS (``httpx.URL.raw_host``).

    Raises:
        BlockedAddress: an answer is not :func:`is_public_address` (one private answer among
            public ones is refused too: the next lookup could pick it).
        OSError: the name does not resolve (``socket.gaierror``): a transient failure.
    """
    infos = await asyncio.get_running_loop().run_in_executor(
        _resolver, partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    )
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        if not is_public_address(_address(address)):
            raise BlockedAddress(f"{host} resolves to {address}, which is not a public address")
    if not addresses:
        raise OSError(f"{host} has no address")
    return addresses
