"""A REST session of the ``hypermedia`` client commands: where the gateway is and which API key to
send (:class:`ClientSettings`), and the calls they make (:class:`Session`), each error answered
by the API turned into an :class:`ApiError` that keeps its ``error_code`` and detail."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import quote

import httpx

DEFAULT_URL: Final = "http://127.0.0.1:8080"
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})


class ConfigMissing(Exception):
    """No API key in the environment or the config file; ``str()`` says where to put one."""


class ApiError(Exception):
    """An error the API answered (``application/problem+json``), or the gateway unreachable
    (``status`` 0, ``error_code`` ``UNREACHABLE``). (Not a frozen dataclass: raised inside a
    ``with``, Python sets its ``__traceback__``.)"""

    def __init__(self, status: int, error_code: str, detail: str) -> None:
        super().__init__(status, error_code, detail)
        self.status, self.error_code, self.detail = status, error_code, detail

    def __str__(self) -> str:
        where = f"{self.status} " if self.status else ""
        return f"{where}{self.error_code}: {self.detail}"


def config_path(env: dict[str, str] | None = None) -> Path:
    """``HM_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/hypermedia/client.toml`` (``~/.config``)."""
    env = dict(os.environ) if env is None else env
    if env.get("HM_CLIENT_CONFIG"):
        return Path(env["HM_CLIENT_CONFIG"])
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "hypermedia" / "client.toml"


@dataclass(frozen=True)
class ClientSettings:
    """Where the gateway is and the API key: ``HM_API_URL`` / ``HM_API_KEY`` from the environment,
    else ``url`` / ``api_key`` of the config file (:func:`config_path`), else the default URL."""

    url: str
    api_key: str

    @classmethod
    def load(cls, env: dict[str, str] | None = None) -> ClientSettings:
        """Raises ConfigMissing without a key, ValueError for a config file that is not TOML."""
        env = dict(os.environ) if env is None else env
        path = config_path(env)
        file: dict[str, Any] = {}
        if path.is_file():
            try:
                file = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: not TOML: {exc}") from None
        key = env.get("HM_API_KEY") or str(file.get("api_key") or "")
        if not key:
            raise ConfigMissing(f"no API key: set HM_API_KEY, or api_key in {path}")
        if not key.isascii() or not key.isprintable() or " " in key:
            raise ValueError("HM_API_KEY: an API key is printable ASCII without spaces (hm_…)")
        url = env.get("HM_API_URL") or str(file.get("url") or DEFAULT_URL)
        try:
            parts: httpx.URL | None = httpx.URL(url)
        except httpx.InvalidURL:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.host:
            raise ValueError("HM_API_URL: the gateway's address is an http:// or https:// URL with a host")
        return cls(url.rstrip("/"), key)


def _segment(value: str) -> str:
    """An id as one path segment: percent-encoded, so ``../operations`` stays an (unknown) id; an
    empty one is refused here (it would name the collection)."""
    if not value.strip():
        raise ApiError(404, "NOT_FOUND", "an empty id")
    return quote(value, safe="")


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        raise ApiError(response.status_code, str(body.get("error_code")), str(body.get("detail")))
    except (ValueError, AttributeError):
        raise ApiError(response.status_code, "HTTP_ERROR", response.text[:200]) from None


class _Counted:
    """A file read through :meth:`read` with ``on_read(n)`` after each piece (upload progress)."""

    def __init__(self, file: IO[bytes], on_read: Callable[[int], None]) -> None:
        self._file, self._on_read = file, on_read

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self._on_read(len(data))
        return data


class Session:
    """The calls of the client commands; a context manager (closes its connections)."""

    def __init__(self, settings: ClientSettings, timeout: float = 60.0) -> None:
        self._http = httpx.Client(
            base_url=settings.url,
            headers={"Authorization": f"Bearer {settings.api_key}"},
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "UNREACHABLE", f"{self._http.base_url}: {type(exc).__name__}: {exc}") from None
        _raise_for(response)
        if response.status_code == 204:  # No Content: a delete
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                response.status_code, "BAD_RESPONSE", "the answer is not JSON: is HM_API_URL the gateway?"
            ) from None

    def upload(self, path: Path, on_read: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
        """``POST /v1/objects`` of the file at ``path``; ``on_read`` gets each piece's size."""
        name = path.name.encode("utf-8", "replace").decode()  # a name that is not UTF-8: its bytes as ?
        with path.open("rb") as file:
            return dict(self._call("POST", "/v1/objects", files={"file": (name, _Counted(file, on_read))}))

    def process(
        self,
        object_id: str,
        operations: list[Any],
        priority: int | None = None,
        *,
        not_before: str | None = None,
        delay_seconds: float | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/hypermedia/process``; ``not_before`` (RFC 3339) or ``delay_seconds`` delay
        the jobs (docs/api.md, "Delayed jobs")."""
        body: dict[str, Any] = {"object_id": object_id, "operations": operations}
        if priority is not None:
            body["priority"] = priority
        if not_before is not None:
            body["not_before"] = not_before
        if delay_seconds is not None:
            body["delay_seconds"] = delay_seconds
        return dict(self._call("POST", "/v1/hypermedia/process", json=body))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/jobs/{_segment(job_id)}"))

    def jobs(self, **filters: Any) -> dict[str, Any]:
        """``GET /v1/jobs`` with the filters that are not None (``status`` may be a list)."""
        return dict(self._call("GET", "/v1/jobs", params={k: v for k, v in filters.items() if v is not None}))

    def credits(self) -> dict[str, Any]:
        """``GET /v1/credits``: ``balance``, ``held``, ``available`` (credits)."""
        return dict(self._call("GET", "/v1/credits"))

    def ledger(self, limit: int, cursor: str | None = None) -> dict[str, Any]:
        """``GET /v1/account/ledger``: ``entries`` newest first, ``next_cursor``."""
        params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        return dict(self._call("GET", "/v1/account/ledger", params=params))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/jobs/{_segment(job_id)}:cancel"))

    def objects(self, **filters: Any) -> dict[str, Any]:
        """``GET /v1/objects`` with the filters that are not None (``kind``, ``limit``, ``cursor``)."""
        return dict(
            self._call("GET", "/v1/objects", params={k: v for k, v in filters.items() if v is not None})
        )

    def object(self, object_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/objects/{_segment(object_id)}"))

    def delete_object(self, object_id: str) -> dict[str, Any]:
        return dict(self._call("DELETE", f"/v1/objects/{_segment(object_id)}"))

    def schedules(self) -> dict[str, Any]:
        """``GET /v1/schedules``."""
        return dict(self._call("GET", "/v1/schedules"))

    def add_schedule(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/schedules`` (docs/api.md "Schedules")."""
        return dict(self._call("POST", "/v1/schedules", json=body))

    def schedule_runs(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/schedules/{_segment(name)}/runs"))

    def schedule_action(self, name: str, action: str) -> dict[str, Any]:
        """``POST /v1/schedules/{name}:{action}`` (``pause``, ``resume``, ``trigger``)."""
        return dict(self._call("POST", f"/v1/schedules/{_segment(name)}:{action}"))

    def delete_schedule(self, name: str) -> None:
        """``DELETE /v1/schedules/{name}`` (204, no body)."""
        self._call("DELETE", f"/v1/schedules/{_segment(name)}")

    def operations(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/operations"))

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job's events (``GET /v1/jobs/{id}/events``, Server-Sent Events) until it ends."""
        try:
            with self._http.stream(
                "GET", f"/v1/jobs/{_segment(job_id)}/events", timeout=httpx.Timeout(None, connect=5.0)
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        yield dict(json.loads(line[5:]))
        except httpx.TransportError as exc:
            raise ApiError(0, "UNREACHABLE", f"{type(exc).__name__}: {exc}") from None

    def download(self, job_id: str, output_type: str, to: Path) -> int:
        """The output through its stable link into ``to``; returns the bytes written."""
        try:
            with self._http.stream(
                "GET", f"/v1/jobs/{_segment(job_id)}/outputs/{_segment(output_type)}", follow_redirects=True
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    _raise_for(r)
                written = 0
                with to.open("wb") as out:
                    for chunk in r.iter_bytes():
                        written += out.write(chunk)
                return written
        except httpx.TransportError as exc:
            raise ApiError(0, "UNREACHABLE", f"{type(exc).__name__}: {exc}") from None
