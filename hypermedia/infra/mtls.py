"""Service authentication for internal gRPC: mutual TLS, one identity per service, rights per method.

Every internal server (storage, credits, a worker's status port) asks each caller for a client
certificate signed by the platform's CA (``grpc.ssl_server_credentials(require_client_auth=True)``):
a caller without one, or with one from another CA, fails the TLS handshake. The caller's identity is
the URI SAN ``spiffe://hypermedia/<identity>`` of its certificate (:data:`IDENTITIES`); the
:class:`AuthInterceptor` of the server then allows a method only to the identities
:data:`RIGHTS` lists for it: an unknown identity is UNAUTHENTICATED, a known one outside its
rights PERMISSION_DENIED, both logged with the identity and the method (ADR 0044).

Each service certificate also names its service as a DNS SAN (``storage``), and a client checks
the server it reached against the name it expected (``grpc.ssl_target_name_override``), so a
worker's certificate cannot pose as storage.

Settings (:class:`InternalAuthSettings`): ``HM_INTERNAL_AUTH`` (``mtls``, the default, or ``none``
for tests and embedded use), ``HM_TLS_CA``, ``HM_TLS_CERT``, ``HM_TLS_KEY`` (PEM files).
:func:`make_ca` / :func:`issue` make the CA and certificates ``hypermedia up`` uses (the
``cryptography`` package); a cluster takes them from a Secret (cert-manager, deploy/k8s).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import Field, model_validator

from hypermedia.core import metrics
from hypermedia.core.config import ComponentSettings, ConfigError, load
from hypermedia.core.errors import ERROR_CODE_METADATA_KEY

log = logging.getLogger(__name__)

SPIFFE_PREFIX = "spiffe://hypermedia/"
"""A service's identity is the URI SAN ``spiffe://hypermedia/<identity>`` of its certificate."""
WORKERS = frozenset({"imageworker", "docworker", "ocrworker", "mediaworker", "bulkworker"})
"""Worker identities; ``bulkworker`` is a unit of bulk lanes (ADR 0057), any engine's."""
IDENTITIES = frozenset({"gateway", "storage", "credits", "reaper", "admin", *WORKERS})
"""Every identity the platform issues a certificate to (``admin``: the ``hypermedia admin`` CLI)."""
CERT_VALIDITY = datetime.timedelta(days=7)
"""Lifetime of a certificate ``hypermedia up`` issues (it issues new ones at every start); a
cluster's cert-manager renews its own (deploy/k8s: 7 days, renewed after 5)."""

_STORAGE = "/hypermedia.storage.v1.StorageService/"
_CREDITS = "/hypermedia.credits.v1.CreditsService/"
_GATEWAY = frozenset({"gateway"})
RIGHTS: Mapping[str, frozenset[str]] = {
    # Storage: the gateway manages originals and signs result downloads; a worker moves only the
    # bytes of a job whose live attempt it holds (GrantJob, RegisterOutputs check the attempt).
    _STORAGE + "CreateUpload": _GATEWAY,
    _STORAGE + "CompleteUpload": _GATEWAY,
    _STORAGE + "GetObject": _GATEWAY,
    _STORAGE + "ListObjects": _GATEWAY,
    _STORAGE + "DeleteObject": _GATEWAY,
    _STORAGE + "PresignGet": _GATEWAY,
    _STORAGE + "GrantJob": WORKERS,
    _STORAGE + "RegisterOutputs": WORKERS,
    _STORAGE + "DeleteOutput": WORKERS,  # a cancelled attempt's own uploads, fenced as GrantJob
    # PresignOutputPut, RegisterOutput: per-key calls no service makes any more (GrantJob and
    # RegisterOutputs replaced them); absent here, so nobody may call them.
    # Credits: only the gateway holds; a job's end settles (worker, reaper; the gateway releases
    # the hold of a cancelled or uncreated job); only the admin CLI grants.
    _CREDITS + "Estimate": _GATEWAY,
    _CREDITS + "Hold": _GATEWAY,
    _CREDITS + "EstimateAndHold": _GATEWAY,
    _CREDITS + "GetBalance": _GATEWAY | {"admin"},
    _CREDITS + "Commit": WORKERS | {"reaper"},
    _CREDITS + "Release": WORKERS | {"reaper", "gateway"},
    _CREDITS + "Settle": WORKERS | {"reaper"},
    _CREDITS + "ListHolds": frozenset({"reaper", "admin"}),
    _CREDITS + "ListLedger": _GATEWAY | {"admin"},
    _CREDITS + "Grant": frozenset({"admin"}),
    "/hypermedia.worker.v1.WorkerService/GetStatus": IDENTITIES,
}
"""Which identities may call which method (full gRPC method name). A method not listed here is
refused to everyone, except the health and reflection services, open to every known identity."""
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/")
"""Services every known identity may call (probes, grpcurl)."""


class InternalAuthSettings(ComponentSettings):
    """How this process authenticates internal gRPC. In ``mtls`` mode the three files are required
    (and read at start); ``none`` is plaintext with no authentication, for tests and embedded use."""

    mode: Literal["mtls", "none"] = Field("mtls", validation_alias="HM_INTERNAL_AUTH")
    """``mtls`` (default) or ``none``."""
    ca: str = Field("", validation_alias="HM_TLS_CA")
    """PEM file of the CA that signs every service certificate (trust anchor of both sides)."""
    cert: str = Field("", validation_alias="HM_TLS_CERT")
    """PEM file of this service's certificate (URI SAN ``spiffe://hypermedia/<identity>``)."""
    key: str = Field("", validation_alias="HM_TLS_KEY")
    """PEM file of this service's private key."""

    @model_validator(mode="after")
    def _files(self) -> InternalAuthSettings:
        if self.mode == "mtls":
            missing = [
                name
                for name, value in (
                    ("HM_TLS_CA", self.ca),
                    ("HM_TLS_CERT", self.cert),
                    ("HM_TLS_KEY", self.key),
                )
                if not value
            ]
            if missing:
                raise ValueError(
                    f"HM_INTERNAL_AUTH=mtls needs {', '.join(missing)} (PEM files); "
                    "HM_INTERNAL_AUTH=none turns service authentication off (tests only)"
                )
            for name, value in (("HM_TLS_CA", self.ca), ("HM_TLS_CERT", self.cert), ("HM_TLS_KEY", self.key)):
                if not os.access(value, os.R_OK):
                    raise ValueError(f"{name}: cannot read the file it names")
        return self

    def tls(self) -> Tls | None:
        """The PEM bytes of the three files (None in ``none`` mode). Raises OSError if unreadable."""
        if self.mode == "none":
            return None
        return Tls(Path(self.ca).read_bytes(), Path(self.cert).read_bytes(), Path(self.key).read_bytes())


@dataclass(frozen=True)
class Tls:
    """PEM bytes of the CA certificate, this process's certificate and its private key."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def from_dir(cls, directory: Path, identity: str) -> Tls:
        """The files :func:`issue` wrote for ``identity`` in ``directory``."""
        return cls(
            (directory / "ca.pem").read_bytes(),
            (directory / f"{identity}.pem").read_bytes(),
            (directory / f"{identity}-key.pem").read_bytes(),
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present our certificate, require one from every client, signed by our CA."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only our CA, present our certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def cert_identity(cert_pem: bytes) -> str | None:
    """The identity a PEM certificate names (its URI SAN ``spiffe://hypermedia/<identity>``), or None."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(SPIFFE_PREFIX) and uri[len(SPIFFE_PREFIX) :] in IDENTITIES:
            return uri[len(SPIFFE_PREFIX) :]
    return None


def from_environment() -> Tls | None:
    """This process's internal-gRPC credentials from :class:`InternalAuthSettings`: None when
    ``HM_INTERNAL_AUTH=none`` (logged at WARNING). Logs the mode and the identity once.

    Raises:
        ConfigError: mtls without the three files, a file unreadable, or a certificate that names
            no known identity (the service exits 78).
    """
    settings = load(InternalAuthSettings)
    if settings.mode == "none":
        log.warning("internal gRPC: no service authentication (HM_INTERNAL_AUTH=none; tests only)")
        return None
    try:
        tls = settings.tls()
    except OSError as exc:
        raise ConfigError(f"invalid configuration:\n  HM_TLS_*: {exc.strerror}") from None
    assert tls is not None
    identity = cert_identity(tls.cert)
    if identity is None:
        raise ConfigError(
            "invalid configuration:\n  HM_TLS_CERT: the certificate names no service identity "
            f"(a URI SAN {SPIFFE_PREFIX}<one of {', '.join(sorted(IDENTITIES))}>)"
        )
    log.info("internal gRPC: mutual TLS as %s", identity)
    return tls


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The identity of the caller (``gateway``, ...) from its verified certificate's URI SAN
    ``spiffe://hypermedia/<identity>`` (grpc's ``peer_spiffe_id`` / ``peer_uri``
    auth properties); None for a plaintext call or a certificate naming no known identity."""
    auth = context.auth_context() or {}
    names = [*auth.get("peer_spiffe_id", []), *auth.get("peer_uri", [])]
    for raw in names:
        name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if name.startswith(SPIFFE_PREFIX) and name[len(SPIFFE_PREFIX) :] in IDENTITIES:
            return name[len(SPIFFE_PREFIX) :]
    return None


def allowed(identity: str, method: str) -> bool:
    """Whether ``identity`` may call the full gRPC ``method`` (:data:`RIGHTS`, :data:`OPEN_PREFIXES`)."""
    if method.startswith(OPEN_PREFIXES):
        return identity in IDENTITIES
    return identity in RIGHTS.get(method, frozenset())


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call whose caller has no known identity (UNAUTHENTICATED) or whose identity may not
    call the method (PERMISSION_DENIED), before the handler runs; ``hm-error-code`` trailer
    ``UNAUTHENTICATED`` / ``PERMISSION_DENIED``; each refusal logged at WARNING with the caller's
    identity (or its peer address) and the method. Wraps every kind of handler."""

    def __init__(self, rights: Callable[[str, str], bool] = allowed) -> None:
        self._allowed = rights

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        check = self._check

        def guard(inner: Any, streams_out: bool) -> Any:
            if streams_out:

                async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
                    await check(context, method)
                    result = inner(request, context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    else:  # a handler writing with context.write returns an awaitable
                        await result

                return streamed

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(context, method)
                return await inner(request, context)

            return unary

        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
            ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
            ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
            ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
        )
        for attr, make, streams_out in kinds:
            inner = getattr(handler, attr)
            if inner is not None:
                return make(
                    guard(inner, streams_out),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    async def _check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        identity = peer_identity(context)
        service, _, name = method.lstrip("/").partition("/")
        if identity is None:
            log.warning("internal call refused, no service identity: %s from %s", method, context.peer())
            metrics.GRPC_HANDLED.labels(service, name, grpc.StatusCode.UNAUTHENTICATED.name).inc()
            context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, "UNAUTHENTICATED"),))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no valid service certificate")
        elif not self._allowed(identity, method):
            log.warning("internal call refused, outside its rights: %s called %s", identity, method)
            metrics.GRPC_HANDLED.labels(service, name, grpc.StatusCode.PERMISSION_DENIED.name).inc()
            context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, "PERMISSION_DENIED"),))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not call {method}")


# --- making a CA and certificates (hypermedia up, tests) ------------------------------------------


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the start (no window where others may read)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(
    directory: Path, name: str = "hypermedia internal CA"
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed CA (ECDSA P-256, valid :data:`CERT_VALIDITY`) written to
    ``directory/ca.pem`` and ``directory/ca-key.pem`` (both mode 0600; the directory is created 0700).
    Returns the certificate and its key, to :func:`issue` with."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write(directory / "ca-key.pem", _key_pem(key))
    return cert, key


def issue(
    directory: Path,
    identity: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    validity: datetime.timedelta = CERT_VALIDITY,
) -> Tls:
    """A certificate for ``identity`` signed by ``ca``: CN and DNS SAN ``identity``, URI SAN
    ``spiffe://hypermedia/<identity>``, DNS ``localhost`` and IP 127.0.0.1 (so grpcurl reaches
    a local platform by address), server and client auth, valid ``validity``. Written to
    ``directory/<identity>.pem`` and ``<identity>-key.pem`` (mode 0600). Raises ValueError for a
    name outside :data:`IDENTITIES`."""
    if identity not in IDENTITIES:
        raise ValueError(f"unknown service identity {identity!r}; known: {', '.join(sorted(IDENTITIES))}")
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(SPIFFE_PREFIX + identity),
                    x509.DNSName(identity),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _key_pem(key)
    _write(directory / f"{identity}.pem", cert_pem)
    _write(directory / f"{identity}-key.pem", key_pem)
    return Tls(ca_cert.public_bytes(serialization.Encoding.PEM), cert_pem, key_pem)


def issue_all(directory: Path) -> dict[str, dict[str, str]]:
    """A new CA in ``directory`` and a certificate for every identity of :data:`IDENTITIES`.
    Returns ``{identity: {"HM_TLS_CA": …, "HM_TLS_CERT": …, "HM_TLS_KEY": …}}`` (paths)."""
    ca = make_ca(directory)
    files = {}
    for identity in sorted(IDENTITIES):
        issue(directory, identity, ca)
        files[identity] = {
            "HM_TLS_CA": str(directory / "ca.pem"),
            "HM_TLS_CERT": str(directory / f"{identity}.pem"),
            "HM_TLS_KEY": str(directory / f"{identity}-key.pem"),
        }
    return files
