"""A local HTTP server that plays the Kubernetes API server for the scheduler's ``kubernetes``
provider (no cluster can run here): pods and pod templates in namespaces, create/get/list (with
equality label selectors)/delete, answering as the real one does — the object as JSON, 201 on
create, ``Status`` objects with the real reasons and codes (404 NotFound, 409 AlreadyExists,
422 Invalid when the body fails the Kubernetes 1.33 OpenAPI schema, by ``kubernetes-validate``,
401 without the bearer token) — and a graceful delete that sets ``deletionTimestamp`` and leaves
the pod until :meth:`FakeKubeApi.kubelet` finishes it, as a kubelet would after its SIGTERM.

Every request is recorded (:attr:`FakeKubeApi.requests`). It serves no watch: the provider
polls with list at every scheduler cycle.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

KUBE_VERSION = "1.33"
PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|podtemplates)(?:/(?P<name>[^/]+))?$")
KINDS = {"pods": "Pod", "podtemplates": "PodTemplate"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str
    body: dict[str, Any] | None


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, kind: str = "", name: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "kind": kind},
        "code": code,
    }


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based and existence selectors (``a=b,c==d,e!=f,g,!h``)."""
    for term in filter(None, selector.split(",")):
        if "=" not in term:
            if (term.startswith("!") and term[1:] in labels) or (
                not term.startswith("!") and term not in labels
            ):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key) != value:
                return False
    return True


class FakeKubeApi:
    """The server on ``127.0.0.1:{port}``; a context manager. ``token`` is the bearer token it
    requires."""

    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.requests: list[Request] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """Writes a kubeconfig for this server (context ``fake``) to ``path``."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "scheduler", "user": {"token": self.token}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "scheduler"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    # -- what a test does as the cluster -----------------------------------------------------

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return [o for (k, ns, _), o in self.objects.items() if k == "pods" and ns == namespace]

    def kubelet(
        self, namespace: str, name: str, phase: str, reason: str = "", exit_code: int | None = None
    ) -> None:
        """Sets a pod's phase as its kubelet would report it (Running, Succeeded, Failed), with a
        pod ``reason`` (e.g. Evicted) and the first container's exit code."""
        with self._lock:
            pod = self.objects[("pods", namespace, name)]
            status: dict[str, Any] = {"phase": phase, "startTime": pod["status"].get("startTime", _now())}
            if reason:
                status["reason"] = reason
            if exit_code is not None:
                container = pod["spec"]["containers"][0]["name"]
                status["containerStatuses"] = [
                    {
                        "name": container,
                        "image": pod["spec"]["containers"][0].get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Error" if exit_code else "Completed",
                            }
                        },
                    }
                ]
            pod["status"] = status

    def finish_deletions(self) -> int:
        """Removes the pods being deleted (their grace period over); returns how many."""
        with self._lock:
            gone = [key for key, o in self.objects.items() if o["metadata"].get("deletionTimestamp")]
            for key in gone:
                del self.objects[key]
            return len(gone)

    # -- the API -----------------------------------------------------------------------------

    def _handle(
        self, method: str, raw_path: str, auth: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        self.requests.append(Request(method, parts.path, query, auth, body))
        if auth != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        match = PATH.match(parts.path)
        if match is None:
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        ns, kind, name = match["ns"], match["kind"], match["name"]
        with self._lock:
            if method == "POST" and name is None:
                return self._create(kind, ns, body or {})
            if method == "GET" and name is None:
                selector = query.get("labelSelector", [""])[0]
                items = [
                    o
                    for (k, n, _), o in sorted(self.objects.items())
                    if k == kind and n == ns and _matches(o["metadata"].get("labels") or {}, selector)
                ]
                return 200, {
                    "kind": f"{KINDS[kind]}List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(len(self.requests))},
                    "items": items,
                }
            found = self.objects.get((kind, ns, name or ""))
            if found is None:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found', kind, name or "")
            if method == "GET":
                return 200, found
            if method == "DELETE":
                if kind == "pods":
                    found["metadata"].setdefault("deletionTimestamp", _now())
                    found["metadata"]["deletionGracePeriodSeconds"] = found["spec"].get(
                        "terminationGracePeriodSeconds", 30
                    )
                else:
                    del self.objects[(kind, ns, name or "")]
                return 200, found
        return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")

    def _create(self, kind: str, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = (body.get("metadata") or {}).get("name", "")
        try:
            kubernetes_validate.validate(body, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            first = str(exc).splitlines()[0]
            return 422, _status(422, "Invalid", f'{KINDS[kind]} "{name}" is invalid: {first}', kind, name)
        if body.get("kind") != KINDS[kind] or not name:
            return 400, _status(400, "BadRequest", f"the body is not a named {KINDS[kind]}")
        if (kind, ns, name) in self.objects:
            return 409, _status(409, "AlreadyExists", f'{kind} "{name}" already exists', kind, name)
        obj = json.loads(json.dumps(body))
        obj["metadata"] |= {
            "namespace": ns,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(len(self.requests)),
            "creationTimestamp": _now(),
        }
        if kind == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        self.objects[(kind, ns, name)] = obj
        return 201, obj

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                code, reply = api._handle(
                    self.command, self.path, self.headers.get("Authorization", ""), body
                )
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
