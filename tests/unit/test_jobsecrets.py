"""Document passwords before anything is stored: taken out of params and checked
(:func:`hypermedia.jobs.secrets.take_password`), and fingerprinted for the Idempotency-Key request
hash with an HMAC keyed by the gateway's secret (the gateway's ``_take_passwords`` and
``_hashed_operations``)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from hypermedia.core import config
from hypermedia.core.errors import InvalidArgument
from hypermedia.jobs import secrets as jobsecrets
from services.gateway.creation import JobCreation
from services.gateway.process_request import OperationRequest
from services.gateway.settings import GatewaySettings

SECRET = "gateway-secret-0123456789abcdef"


def _api(password_key: bytes | None) -> JobCreation:
    """A JobCreation whose dependencies are never touched by the methods under test."""
    return JobCreation(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        stream_prefix="HM",
        max_operations=16,
        password_key=password_key,
    )


def test_take_password_splits_the_params_without_changing_them() -> None:
    params = {"pages": "1-2", "password": "openpassword"}
    rest, password = jobsecrets.take_password(params)
    assert (rest, password) == ({"pages": "1-2"}, "openpassword")
    assert params == {"pages": "1-2", "password": "openpassword"}
    assert jobsecrets.take_password({"dpi": 36}) == ({"dpi": 36}, None)
    longest = "é" * jobsecrets.MAX_PASSWORD_LENGTH
    assert jobsecrets.take_password({"password": longest}) == ({}, longest)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (None, "must be a string"),
        (1234, "must be a string"),
        (["openpassword"], "must be a string"),
        ("", "must not be empty"),
        ("x" * 1025, "at most 1024 characters"),
        ("open\x00password", "NUL"),
        ("open\ud800password", "valid Unicode"),
    ],
)
def test_a_bad_password_is_invalid_params_and_never_echoed(value: Any, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        jobsecrets.take_password({"password": value})
    assert err.value.error_code == "INVALID_PARAMS"
    assert fragment in err.value.public_message
    for shown in ("openpassword", "1234", "x" * 100, "password\x00"):
        assert shown not in err.value.public_message


def test_the_digest_is_an_hmac_with_a_derived_key_not_a_plain_hash() -> None:
    key = jobsecrets.derive_key(SECRET)
    assert key == hmac.new(SECRET.encode(), jobsecrets.IDEMPOTENCY_KEY_LABEL, hashlib.sha256).digest()
    digest = jobsecrets.password_digest(key, "openpassword")
    assert digest == hmac.new(key, b"openpassword", hashlib.sha256).hexdigest()
    assert digest != hashlib.sha256(b"openpassword").hexdigest()
    assert digest != jobsecrets.password_digest(jobsecrets.derive_key(SECRET + "x"), "openpassword")
    with pytest.raises(ValueError):
        jobsecrets.derive_key("")


def test_the_request_hash_of_a_request_without_password_is_unchanged() -> None:
    """Keys stored before passwords existed must still replay: without a password an operation is
    hashed as ``[name, params]``, as it always was."""
    api = _api(jobsecrets.derive_key(SECRET))
    operations = [OperationRequest("pdf_preview", {"dpi": 36}), OperationRequest("pdf_info", {})]
    stripped, passwords = api._take_passwords(operations)
    assert passwords == [None, None] and stripped == operations
    before = [[o.name, o.params] for o in operations]
    assert json.dumps(api._hashed_operations(stripped, passwords)) == json.dumps(before)


def test_passwords_change_the_hashed_operations_only_through_their_hmac() -> None:
    api = _api(jobsecrets.derive_key(SECRET))

    def hashed(password: str | None) -> str:
        params: dict[str, Any] = {"dpi": 36} if password is None else {"dpi": 36, "password": password}
        stripped, passwords = api._take_passwords([OperationRequest("pdf_preview", params)])
        assert stripped == [OperationRequest("pdf_preview", {"dpi": 36})]
        return json.dumps(api._hashed_operations(stripped, passwords))

    one, same, other, none = hashed("openpassword"), hashed("openpassword"), hashed("other"), hashed(None)
    assert one == same and len({one, other, none}) == 3
    assert "openpassword" not in one and hashlib.sha256(b"openpassword").hexdigest() not in one


def test_without_a_secret_key_a_password_is_refused() -> None:
    api = _api(None)
    with pytest.raises(InvalidArgument) as err:
        api._take_passwords([OperationRequest("pdf_info", {"password": "openpassword"})])
    assert err.value.error_code == "PASSWORDS_NOT_ENABLED"
    assert "openpassword" not in err.value.public_message
    # Requests without one are unaffected.
    assert api._take_passwords([OperationRequest("pdf_info", {})])[1] == [None]


def test_a_short_gateway_secret_stops_the_start_without_showing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HM_GATEWAY_SECRET_KEY", "short-secret")
    with pytest.raises(config.ConfigError) as err:
        config.load(GatewaySettings)
    assert "HM_GATEWAY_SECRET_KEY" in str(err.value) and "short-secret" not in str(err.value)
    monkeypatch.setenv("HM_GATEWAY_SECRET_KEY", SECRET)
    assert config.load(GatewaySettings).secret_key.get_secret_value() == SECRET
    monkeypatch.delenv("HM_GATEWAY_SECRET_KEY")
    assert config.load(GatewaySettings).secret_key.get_secret_value() == ""
