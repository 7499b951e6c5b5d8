"""The LibreOffice conversion host: one warm ``soffice`` and the UNO client that drives it.

This file runs as a **script** under a Python that has LibreOffice's ``uno`` module (Debian's
``python3-uno`` for ``/usr/bin/python3``), never inside the worker: it imports nothing of
``hypermedia`` and only the standard library besides ``uno``. The worker starts it confined (its
own uid, rlimits, an empty network namespace and a private ``/tmp``; see
:mod:`hypermedia.engines.documents.office`) and talks to it over stdin/stdout, one JSON object per line.

Start: ``python3 office_host.py '{"soffice": …, "profile": …, "pipe": …, "start_timeout": s}'``.
The host starts ``soffice --headless --accept=pipe,name=…`` with the throwaway ``profile``
(written first: macros off, remote links blocked), connects over the named pipe (a Unix socket in
``/tmp``) and prints ``{"event": "ready", "soffice_pid": …}``. Then, per request line
``{"input": path, "output": path, "filter": import filter name}``, it loads the document hidden,
read-only, without running macros or updating links, exports it to PDF and prints
``{"ok": true, "pages": N, "export_filter": …}`` or ``{"ok": false, "code": …, "message": …}``
(``code``: ``PARSE_ERROR`` or ``UNSUPPORTED_FORMAT`` for the document; ``ENGINE_FAILED`` when
LibreOffice died or stopped answering, after which the host exits).
On EOF it terminates ``soffice`` and exits 0. Exit 3: ``soffice`` did not come up.

UNO names used here (LibreOffice SDK reference, ``com.sun.star``): ``frame.Desktop``,
``document.MacroExecMode.NEVER_EXECUTE`` (0), ``document.UpdateDocMode.NO_UPDATE`` (0),
``MediaDescriptor`` properties ``Hidden``, ``ReadOnly``, ``FilterName``, ``MacroExecutionMode``,
``UpdateDocMode``; export filters ``writer_pdf_Export``, ``calc_pdf_Export``,
``impress_pdf_Export``, ``draw_pdf_Export``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uno  # type: ignore[import-not-found]
from com.sun.star.beans import PropertyValue  # type: ignore[import-not-found]
from com.sun.star.connection import NoConnectException  # type: ignore[import-not-found]

NEVER_EXECUTE = 0
NO_UPDATE = 0

# Configuration written into the throwaway profile before soffice first reads it
# (officecfg/registry/schema/org/openoffice/Office/Common.xcs): macro security "very high" with
# macro execution disabled outright, links from documents outside trusted locations blocked, no
# update checks, no recovery data, no recent-documents list.
REGISTRY = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop oor:name="MacroSecurityLevel" oor:op="fuse"><value>3</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop oor:name="DisableMacrosExecution" oor:op="fuse"><value>true</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop oor:name="BlockUntrustedRefererLinks" oor:op="fuse"><value>true</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/History"><prop oor:name="PickListSize" oor:op="fuse"><value>0</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/AutoSave"><prop oor:name="Enabled" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Recovery/RecoveryInfo"><prop oor:name="Enabled" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="UseLocking" oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Linguistic/General"><prop oor:name="IsSpellAuto" oor:op="fuse"><value>false</value></prop></item>
</oor:items>
"""

EXPORT_FILTERS = (
    ("com.sun.star.text.TextDocument", "writer_pdf_Export"),
    ("com.sun.star.sheet.SpreadsheetDocument", "calc_pdf_Export"),
    ("com.sun.star.presentation.PresentationDocument", "impress_pdf_Export"),
    ("com.sun.star.drawing.DrawingDocument", "draw_pdf_Export"),
)


def prop(name: str, value: Any) -> Any:
    p = PropertyValue()
    p.Name = name
    p.Value = value
    return p


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def write_profile(profile: Path) -> None:
    user = profile / "user"
    user.mkdir(parents=True, exist_ok=True)
    (user / "registrymodifications.xcu").write_text(REGISTRY)


def start_soffice(config: dict[str, Any]) -> subprocess.Popen[bytes]:
    profile = Path(config["profile"])
    write_profile(profile)
    return subprocess.Popen(
        [
            config["soffice"],
            "--headless",
            "--invisible",
            "--nocrashreport",
            "--nodefault",
            "--nofirststartwizard",
            "--nologo",
            "--norestore",
            "--nolockcheck",
            f"-env:UserInstallation={profile.as_uri()}",
            f"--accept=pipe,name={config['pipe']};urp;StarOffice.ComponentContext",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=sys.stderr,
    )


def connect(config: dict[str, Any], soffice: subprocess.Popen[bytes]) -> Any:
    local = uno.getComponentContext()
    resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
    url = f"uno:pipe,name={config['pipe']};urp;StarOffice.ComponentContext"
    deadline = time.monotonic() + float(config["start_timeout"])
    while True:
        try:
            ctx = resolver.resolve(url)
            return ctx.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", ctx)
        except NoConnectException:
            if soffice.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def page_count(doc: Any) -> int:
    """Pages as LibreOffice lays them out: Writer's controller ``PageCount``, sheets' or slides'
    draw pages otherwise (a spreadsheet prints more pages than sheets; 0 there means unknown)."""
    if doc.supportsService("com.sun.star.text.TextDocument"):
        return int(doc.getCurrentController().getPropertyValue("PageCount"))
    if doc.supportsService("com.sun.star.presentation.PresentationDocument") or doc.supportsService(
        "com.sun.star.drawing.DrawingDocument"
    ):
        return int(doc.getDrawPages().getCount())
    return 0


def alive(desktop: Any, soffice: subprocess.Popen[bytes]) -> bool:
    """Whether LibreOffice still answers: its launcher has not exited and the bridge carries a call
    (a dead ``soffice.bin`` makes every UNO call raise ``DisposedException``)."""
    if soffice.poll() is not None:
        return False
    try:
        desktop.getFrames()
    except Exception:
        return False
    return True


def convert(desktop: Any, request: dict[str, Any]) -> dict[str, Any]:
    source = Path(request["input"]).as_uri()
    target = Path(request["output"]).as_uri()
    load = (
        prop("Hidden", True),
        prop("ReadOnly", True),
        prop("FilterName", request["filter"]),
        prop("MacroExecutionMode", NEVER_EXECUTE),
        prop("UpdateDocMode", NO_UPDATE),
    )
    try:
        doc = desktop.loadComponentFromURL(source, "_blank", 0, load)
    except Exception as exc:  # IllegalArgumentException, IOException: the file does not load
        return {"ok": False, "code": "PARSE_ERROR", "message": type(exc).__name__}
    if doc is None:
        return {"ok": False, "code": "PARSE_ERROR", "message": "no document"}
    try:
        export = next((f for service, f in EXPORT_FILTERS if doc.supportsService(service)), None)
        if export is None:
            return {
                "ok": False,
                "code": "UNSUPPORTED_FORMAT",
                "message": "not a text, sheet or slide document",
            }
        pages = page_count(doc)
        doc.storeToURL(target, (prop("FilterName", export),))
        return {"ok": True, "pages": pages, "export_filter": export}
    finally:
        try:
            doc.close(True)
        except Exception:
            doc.dispose()


def main() -> int:
    config = json.loads(sys.argv[1])
    soffice = start_soffice(config)

    def stop(*_: Any) -> None:
        if soffice.poll() is None:
            soffice.terminate()
            try:
                soffice.wait(5)
            except subprocess.TimeoutExpired:
                soffice.kill()

    def terminate(*_: Any) -> None:
        stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    try:
        desktop = connect(config, soffice)
    except Exception as exc:
        stop()
        emit({"event": "failed", "message": f"soffice did not start: {type(exc).__name__}"})
        return 3
    emit({"event": "ready", "soffice_pid": soffice.pid})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = convert(desktop, json.loads(line))
        except Exception as exc:  # the bridge died (soffice crashed) or an unexpected UNO error
            reply = {"ok": False, "code": "ENGINE_FAILED", "message": f"{type(exc).__name__}: {exc}"[:500]}
        if not reply["ok"] and reply.get("code") != "ENGINE_FAILED" and not alive(desktop, soffice):
            # A load "failure" because LibreOffice died while loading is a crash, not the document's.
            reply = {"ok": False, "code": "ENGINE_FAILED", "message": "soffice died during the conversion"}
        emit(reply)
        if reply.get("code") == "ENGINE_FAILED":
            break
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
