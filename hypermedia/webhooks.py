"""Webhook signing secrets in the Standard Webhooks format (https://www.standardwebhooks.com/),
and the checks that keep webhooks off private networks (SSRF): :func:`literal_private_host` when a
job is created, :func:`public_address` when a delivery is sent."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import secrets
import socket

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


def is_public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is public unicast: :attr:`~ipaddress.IPv4Address.is_global` (IANA's
    special-purpose registries: not loopback, private, link-local (169.254.0.0/16, cloud metadata),
    shared 100.64.0.0/10, reserved, unspecified) and not multicast. An IPv4 address inside IPv6
    (IPv4-mapped ``::ffff:a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is judged as the
    IPv4 address; Teredo (``2001::/32``) is never public here."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.teredo is not None:
            return False
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64_PREFIX:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(embedded)
    return address.is_global and not address.is_multicast


def literal_private_host(host: str) -> bool:
    """Whether a URL's host names a non-public address without DNS: an IP literal that is not
    :func:`is_public_address` (brackets, an IPv6 zone and the short IPv4 forms ``inet_aton`` reads
    allowed), ``localhost`` or a name under
    ``.localhost`` (RFC 6761). Other names are judged when delivered (:func:`public_address`)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        try:  # the forms getaddrinfo also reads as IPv4: 127.1, 2130706433, 0x7f.0.0.1
            address = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return False
    return not is_public_address(address)


async def public_address(host: str, port: int) -> str:
    """The address a webhook to ``host:port`` connects to: the first of ``getaddrinfo``'s TCP
    answers, when every answer is public.

    Raises:
        BlockedAddress: an answer is not :func:`is_public_address` (one private answer among
            public ones is refused too: the next lookup could pick it).
        OSError: the name does not resolve (``socket.gaierror``): a transient failure.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = [str(info[4][0]) for info in infos]
    for address in addresses:
        if not is_public_address(ipaddress.ip_address(address.split("%", 1)[0])):
            raise BlockedAddress(f"{host} resolves to {address}, which is not a public address")
    if not addresses:
        raise OSError(f"{host} has no address")
    return addresses[0]
