"""The SSRF guard of webhooks: which addresses are public, which URLs the gateway refuses at once."""

from __future__ import annotations

import ipaddress

import pytest

from hypermedia.core.errors import InvalidArgument
from hypermedia.jobs.webhooks import is_public_address, literal_private_host
from services.gateway.process_request import check_webhook_url


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared address space (carrier NAT)
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("ff02::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:169.254.169.254", False),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("2002:a00:1::", False),  # 6to4 of 10.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("2001::1", False),  # Teredo
        # Python's is_global called these public before 3.11.10 (CVE-2024-4032) or still does:
        ("192.0.0.192", False),  # Oracle Cloud's legacy metadata address
        ("64:ff9b:1::7f00:1", False),  # local-use NAT64 (RFC 8215)
        ("::127.0.0.1", False),  # IPv4-compatible
        ("::ffff:0:127.0.0.1", False),  # SIIT
        ("fec0::1", False),  # site-local
    ],
)
def test_public_addresses(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


@pytest.mark.parametrize(
    ("host", "private"),
    [
        ("localhost", True),
        ("LocalHost.", True),
        ("hooks.localhost", True),
        ("127.0.0.1", True),
        ("127.1", True),
        ("2130706433", True),
        ("0x7f.0.0.1", True),
        ("[::1]", True),
        ("[fe80::1%eth0]", True),
        ("169.254.169.254", True),
        ("example.com", False),  # names are resolved and checked when sent
        ("localhost.localdomain", True),
        ("ip6-localhost", True),
        ("\ud800.example", False),  # not an address form (inet_aton's UnicodeEncodeError)
        ("localhost.example.com", False),
        ("8.8.8.8", False),
        ("[2606:4700::1111]", False),
    ],
)
def test_literal_private_hosts(host: str, private: bool) -> None:
    assert literal_private_host(host) is private


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "https://[::1]/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.5/hook",
        "http://[::ffff:10.0.0.5]/hook",
        "http://0/hook",
        "http://127\u30020\u30020\u30021/hook",  # ideographic full stops: httpx reads 127.0.0.1
        "http://127\uff0e0\uff0e0\uff0e1/hook",  # full-width full stops
        "http://8.8.8.8@127.0.0.1/hook",  # userinfo before the host
        "http://192.0.0.192/opc/v1/instance/",
    ],
)
def test_the_gateway_refuses_webhooks_to_private_literals_unless_allowed(url: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_webhook_url(url)
    assert refused.value.error_code == "INVALID_WEBHOOK_URL"
    assert "public address" in refused.value.public_message
    check_webhook_url(url, allow_private=True)  # HM_WEBHOOK_ALLOW_PRIVATE


def test_public_webhook_urls_pass() -> None:
    for url in ("https://hooks.example.com/x", "http://8.8.8.8:8080/x", "https://[2606:4700::1111]/x"):
        check_webhook_url(url)


@pytest.mark.parametrize(
    "url", ["http://\ud800.example/hook", "http://example.com/\udfff", "http://example.com/?q=\ud800"]
)
def test_a_url_that_is_not_valid_unicode_is_a_422_not_a_500(url: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_webhook_url(url)
    assert refused.value.error_code == "INVALID_WEBHOOK_URL"
