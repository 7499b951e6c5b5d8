"""A small fake instance metadata service over real HTTP: EC2's IMDSv2 (token, then
``spot/instance-action``) and GCE's ``instance/preempted`` (tests of hypermedia/worker/preemption.py)."""

from __future__ import annotations

import datetime as dt
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Metadata(ThreadingHTTPServer):
    """EC2's and GCE's metadata endpoints; :attr:`notice_in` set posts a notice (seconds ahead)."""

    notice_in: float | None = None
    token = "tok-123"
    seen_tokens: list[str]

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen_tokens = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Metadata

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(200, self.server.token)
        else:
            self._reply(400)

    def do_GET(self) -> None:
        notice = self.server.notice_in
        if self.path == "/latest/meta-data/spot/instance-action":
            self.server.seen_tokens.append(self.headers.get("X-aws-ec2-metadata-token", ""))
            if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
                self._reply(401)
            elif notice is None:
                self._reply(404, "Not Found")
            else:
                when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=notice)
                self._reply(
                    200, json.dumps({"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")})
                )
        elif (
            self.path == "/computeMetadata/v1/instance/preempted"
            and self.headers.get("Metadata-Flavor") == "Google"
        ):
            self._reply(200, "FALSE" if notice is None else "TRUE")
        else:
            self._reply(404)
