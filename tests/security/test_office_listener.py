"""The docworker's LibreOffice listeners against hostile documents: what a listener process can see
and do (its uid, namespaces, limits), linked and remote resources, macros. Each test starts real
listeners (:class:`hypermedia.engines.documents.office.OfficePool`) with the platform's defaults and
converts documents the test writes; the listener's processes are inspected through ``/proc``."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import pypdfium2 as pdfium
import pytest

from hypermedia.core import config
from hypermedia.core.errors import PermanentJobError, TransientError
from hypermedia.engines.documents import office
from hypermedia.engines.documents.office import OfficePool, _copy_in
from hypermedia.engines.documents.settings import OfficeSettings
from tests.helpers.office import (
    DOCX_MIME,
    IS_ROOT,
    LISTENER_UID,
    ODT_MIME,
    docx_with_external_image,
    long_odt,
    odt,
    odt_background,
    odt_with_links,
    rtf_includepicture,
    run_pool,
)
from tests.security.conftest import Listener

pytestmark = pytest.mark.skipif(
    shutil.which("soffice") is None,
    reason="LibreOffice is not installed (make test installs it as root: scripts/ensure_debian_packages.sh)",
)


def odt_with_macro(marker: Path) -> bytes:
    """An ODT whose Basic macro, bound to the document's load event, writes ``marker`` (what
    LibreOffice would do if macros ran: a document macro has the listener's file rights)."""
    module = (
        '<?xml version="1.0" encoding="UTF-8"?><script:module xmlns:script="http://openoffice.org/2000/script" '
        'script:name="Module1" script:language="StarBasic">Sub Main\n'
        f'Open "{marker}" For Output As #1\nPrint #1, "macro ran"\nClose #1\nEnd Sub\n</script:module>'
    )
    libraries = (
        '<?xml version="1.0" encoding="UTF-8"?><library:libraries '
        'xmlns:library="http://openoffice.org/2000/library" xmlns:xlink="http://www.w3.org/1999/xlink">'
        '<library:library library:name="Standard" library:link="false"/></library:libraries>'
    )
    library = (
        '<?xml version="1.0" encoding="UTF-8"?><library:library xmlns:library="http://openoffice.org/2000/library" '
        'library:name="Standard" library:readonly="false" library:passwordprotected="false">'
        '<library:element library:name="Module1"/></library:library>'
    )
    events = (
        '<office:scripts><office:event-listeners><script:event-listener script:language="ooo:script" '
        'script:event-name="dom:load" '
        'xlink:href="vnd.sun.star.script:Standard.Module1.Main?language=Basic&amp;location=document"/>'
        "</office:event-listeners></office:scripts>"
    )
    return odt(
        "<text:p>a document with a macro</text:p>",
        {
            "Basic/script-lc.xml": libraries.encode(),
            "Basic/Standard/script-lb.xml": library.encode(),
            "Basic/Standard/Module1.xml": module.encode(),
        },
        head=events,
    )


def pdf_text(data: bytes) -> str:
    return "".join(page.get_textpage().get_text_range() for page in pdfium.PdfDocument(data))


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/<tid>/children``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def check_confined(host_pid: int, marker: Path) -> None:
    """Every process of the listener: its uid, no groups, ``no_new_privs``, namespaces other than
    ours, the address space and core limits; its ``/tmp`` is its own (``marker``, a file in the
    host's ``/tmp``, is not there; its UNO pipe is); its network namespace has only ``lo``."""
    processes = descendants(host_pid)
    assert len(processes) >= 3  # host, soffice launcher (oosplash), soffice.bin
    names = {Path(f"/proc/{p}/exe").resolve().name for p in processes}
    assert "soffice.bin" in names, names
    own_net = os.readlink("/proc/self/ns/net")
    own_mnt = os.readlink("/proc/self/ns/mnt")
    for pid in processes:
        fields = status(pid)
        assert fields["Uid"].split() == [str(LISTENER_UID)] * 4, (pid, fields["Uid"])
        assert fields["Gid"].split()[0] == str(LISTENER_UID)
        assert fields["Groups"] == ""
        assert fields["NoNewPrivs"] == "1"
        assert os.readlink(f"/proc/{pid}/ns/net") != own_net
        assert os.readlink(f"/proc/{pid}/ns/mnt") != own_mnt
        limits = Path(f"/proc/{pid}/limits").read_text()
        assert f"Max address space         {4096 << 20}" in limits, limits
        assert "Max core file size        0" in limits
    seen = sorted(p.name for p in Path(f"/proc/{host_pid}/root/tmp").iterdir())
    assert marker.name not in seen
    assert any(name.startswith("OSL_PIPE_hm-office-") for name in seen), seen
    net = Path(f"/proc/{host_pid}/net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in net] == ["lo"]


@pytest.mark.skipif(not IS_ROOT, reason="a listener of its own uid and namespaces needs root")
def test_a_listener_runs_as_its_own_uid_without_network_with_a_private_tmp(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    marker = Path("/tmp") / f"hm-office-probe-{os.getpid()}"
    marker.write_text("the host's /tmp")

    async def go() -> None:
        pool = OfficePool(tmp_path / "office", [(LISTENER_UID, LISTENER_UID)], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            [listener] = pool.listeners
            assert listener.running and listener.pid is not None
            check_confined(listener.pid, marker)
        finally:
            await pool.close()

    try:
        asyncio.run(go())
    finally:
        marker.unlink()
    # Stopped: nothing of the listener's uid is left, nor its directory.
    deadline = time.monotonic() + 5  # SIGKILLed processes are gone once their parent reaped them
    while LISTENER_UID in _live_uids():
        assert time.monotonic() < deadline, "a process of the listener's uid outlived it"
        time.sleep(0.05)
    assert not (tmp_path / "office" / "slot0").exists()


def _live_uids() -> set[int]:
    """Real uids of the live processes (zombies excluded: they hold nothing but their pid)."""
    uids = set()
    for entry in Path("/proc").iterdir():
        try:
            fields = status(int(entry.name)) if entry.name.isdigit() else {}
        except OSError:  # gone meanwhile
            continue
        if fields and fields["State"].split()[0] != "Z":
            uids.add(int(fields["Uid"].split()[0]))
    return uids


@pytest.mark.parametrize(
    "uid", [pytest.param((LISTENER_UID, LISTENER_UID), id="own-uid"), pytest.param(None, id="worker-uid")]
)
def test_linked_and_remote_resources_are_not_fetched(
    tmp_path: Path, listener: Listener, uid: tuple[int, int] | None
) -> None:
    """Documents that would load a file or a URL are refused before a listener sees them
    (``LINKED_CONTENT_NOT_ALLOWED``, :mod:`hypermedia.engines.documents.links`), among them the two the
    hostile review found LibreOffice follows despite its settings (an ODT paragraph background
    image, an RTF ``INCLUDEPICTURE`` field). Also without root (``worker-uid``: no network
    namespace, the listener has the worker's uid)."""
    if uid is not None and not IS_ROOT:
        pytest.skip("a listener uid needs root")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT-OF-THE-HOST")
    os.chmod(secret, 0o644)
    documents = [
        (odt_with_links(listener.url, f"http://{listener.address}/section.odt"), ODT_MIME),
        (odt_with_links(secret.as_uri(), secret.as_uri()), ODT_MIME),
        (docx_with_external_image(listener.url), DOCX_MIME),
        (odt_background(listener.url), ODT_MIME),
        (odt_background(secret.as_uri()), ODT_MIME),
        (rtf_includepicture(listener.url), "application/rtf"),
    ]
    for result in run_pool(tmp_path, uid, documents):
        assert getattr(result, "error_code", None) == "LINKED_CONTENT_NOT_ALLOWED", result
    assert listener.connections == []


def test_libreoffice_settings_alone_block_the_links_they_can(tmp_path: Path, listener: Listener) -> None:
    """Behind that check, straight to a listener without a network namespace: links are not
    updated on load (``UpdateDocMode`` NO_UPDATE) and links from untrusted documents are blocked
    (``BlockUntrustedRefererLinks``) for linked images, linked sections and DOCX external images:
    they convert, with no connection and no host file in the PDF."""
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT-OF-THE-HOST")
    os.chmod(secret, 0o644)
    documents = [
        (odt_with_links(listener.url, f"http://{listener.address}/section.odt"), ODT_MIME),
        (odt_with_links(secret.as_uri(), secret.as_uri()), ODT_MIME),
        (docx_with_external_image(listener.url), DOCX_MIME),
    ]
    for result in run_pool(tmp_path, None, documents, direct=True):
        assert not isinstance(result, Exception), result
        assert "SECRET-CONTENT" not in pdf_text(result.pdf)  # type: ignore[attr-defined]
    assert listener.connections == []


def test_a_document_macro_does_not_run(tmp_path: Path) -> None:
    """Uploads refuse ODF with Basic (tests/security/test_validation.py); behind that, the
    listener opens documents with ``MacroExecutionMode`` NEVER_EXECUTE in a profile with macros
    disabled: the load-event macro would write a file and does not."""
    marker = tmp_path / "macro-ran"
    os.chmod(tmp_path, 0o777)  # the macro would be able to write here, whatever the uid
    [result] = run_pool(
        tmp_path, (LISTENER_UID, LISTENER_UID) if IS_ROOT else None, [(odt_with_macro(marker), ODT_MIME)]
    )
    assert not isinstance(result, Exception), result
    assert "a document with a macro" in pdf_text(result.pdf)  # type: ignore[attr-defined]
    assert not marker.exists()


def test_a_file_that_is_not_what_its_type_says_is_a_parse_error(tmp_path: Path) -> None:
    """The import filter comes from the type identified at upload, so LibreOffice never sniffs a
    file into another format (an HTML page claiming to be a DOCX is not imported as HTML)."""
    html = b"<html><body><img src='http://127.0.0.1:9/x.png'>hello</body></html>"
    [result] = run_pool(tmp_path, None, [(html, DOCX_MIME)])
    assert isinstance(result, Exception)
    assert getattr(result, "error_code", None) == "PARSE_ERROR"


def test_an_unknown_type_has_no_import_filter(tmp_path: Path) -> None:
    [result] = run_pool(tmp_path, None, [(b"plain text", "text/plain")])
    assert getattr(result, "error_code", None) == "UNSUPPORTED_FORMAT"


def _exit_status_as(uid: int, action: str, path: Path) -> int:
    """Runs one file operation on ``path`` in a child process as ``uid``: 0 when it succeeded,
    13 when it was refused (EACCES/EPERM), 1 otherwise."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if action == "rename":
                os.rename(path, path.with_name("moved"))
            elif action == "symlink":
                os.symlink("/etc", path)
            elif action == "write":
                path.write_bytes(b"x")
            code = 0
        except PermissionError:
            code = 13
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(not IS_ROOT, reason="a listener of its own uid needs root")
def test_a_compromised_listener_cannot_redirect_the_workers_writes() -> None:
    """The worker (root) writes each document into the listener's ``input/``: the listener's uid
    can neither rename that directory, nor put a symlink in its place or inside it, so the worker
    never writes through a path the listener chose. (Under a directory every uid may search, so
    that a refusal is the listener directory's own, as the last, allowed, write shows.)"""
    root = Path(tempfile.mkdtemp(prefix="hm-office-test-"))
    os.chmod(root, 0o755)

    async def go() -> None:
        pool = OfficePool(root / "office", [(LISTENER_UID, LISTENER_UID)], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            base = pool.listeners[0].dir
            assert _exit_status_as(LISTENER_UID, "rename", base / "input") == 13
            assert _exit_status_as(LISTENER_UID, "symlink", base / "input" / "source") == 13
            assert _exit_status_as(LISTENER_UID, "symlink", base / "planted") == 13
            assert _exit_status_as(LISTENER_UID, "write", base / "output" / "document.pdf") == 0
        finally:
            await pool.close()

    try:
        asyncio.run(go())
    finally:
        shutil.rmtree(root)


ODT_TEXT = odt("<text:p>hello from a listener test</text:p>")


def kill_soffice_bin(host_pid: int) -> None:
    """SIGKILLs the listener's ``soffice.bin`` (LibreOffice itself, below its launcher)."""
    for pid in descendants(host_pid):
        if Path(f"/proc/{pid}/exe").resolve().name == "soffice.bin":
            os.kill(pid, signal.SIGKILL)


def test_a_listener_that_dies_while_loading_is_restarted(tmp_path: Path) -> None:
    """LibreOffice killed under a conversion (as a crash would): the conversion is OFFICE_CRASHED
    (permanent: a document can crash LibreOffice every time, as the hostile review's one-cell XLSX
    does), never PARSE_ERROR, and the next conversion restarts the listener."""
    os.chmod(tmp_path, 0o755)
    source = tmp_path / "doc.odt"
    source.write_bytes(ODT_TEXT)

    async def go() -> None:
        settings = config.load(OfficeSettings)
        pool = OfficePool(tmp_path / "office", [(LISTENER_UID, LISTENER_UID) if IS_ROOT else None], settings)
        pool.start()
        await pool.started()
        try:
            [listener] = pool.listeners
            assert listener.pid is not None
            kill_soffice_bin(listener.pid)
            with pytest.raises(PermanentJobError) as crashed:
                await pool.convert(source, ODT_MIME, 60)
            assert crashed.value.error_code == "OFFICE_CRASHED"
            assert not listener.running
            done = await pool.convert(source, ODT_MIME, 60)
            assert "hello from a listener test" in pdf_text(done.pdf)
            assert (listener.starts, done.warm) == (2, False)
        finally:
            await pool.close()

    asyncio.run(go())


def test_a_listener_is_restarted_after_its_conversions_and_a_dead_one_falls_back_to_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.chmod(tmp_path, 0o755)
    source = tmp_path / "doc.odt"
    source.write_bytes(ODT_TEXT)
    monkeypatch.setenv("HM_OFFICE_MAX_CONVERSIONS", "2")

    async def go() -> None:
        pool = OfficePool(tmp_path / "office", [None], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            [listener] = pool.listeners
            warm = [(await pool.convert(source, ODT_MIME, 60)).warm for _ in range(5)]
            # Started by start(), then again before the 3rd and the 5th conversion.
            assert warm == [True, True, False, True, False]
            assert listener.starts == 3
        finally:
            await pool.close()
        # A LibreOffice that does not start: the warm listener fails, one cold start is tried.
        monkeypatch.setenv("HM_OFFICE_SOFFICE", "/nonexistent/soffice")
        monkeypatch.setenv("HM_OFFICE_START_TIMEOUT", "5")
        broken = OfficePool(tmp_path / "broken", [None], config.load(OfficeSettings))
        broken.start()
        await broken.started()
        try:
            with pytest.raises(TransientError) as unavailable:
                await broken.convert(source, ODT_MIME, 60)
            assert unavailable.value.error_code == "OFFICE_UNAVAILABLE"
            assert broken.cold_conversions == 1
        finally:
            await broken.close()

    asyncio.run(go())


@pytest.mark.skipif(not IS_ROOT, reason="a listener of its own uid needs root")
def test_the_document_being_converted_is_readable_by_the_listener_only(tmp_path: Path) -> None:
    """The copy in the listener's input/ is mode 0640 in a 0750 directory of the listener's group:
    a job's uid, or another listener's, cannot read another account's document meanwhile."""
    os.chmod(tmp_path, 0o755)
    source = tmp_path / "doc.odt"
    source.write_bytes(ODT_TEXT)

    async def go() -> None:
        pool = OfficePool(tmp_path / "office", [(LISTENER_UID, LISTENER_UID)], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            [listener] = pool.listeners
            input_dir = listener.dir / "input"
            copy = input_dir / "source"
            await asyncio.to_thread(_copy_in, source, copy, LISTENER_UID)  # as convert() does
            for path, mode in ((input_dir, 0o750), (copy, 0o640)):
                info = path.stat()
                assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, 0, LISTENER_UID)
            converted = await pool.convert(source, ODT_MIME, 60)
            assert "hello from a listener test" in pdf_text(converted.pdf)
            assert not copy.exists()  # removed after each conversion
        finally:
            await pool.close()

    asyncio.run(go())


@pytest.mark.skipif(not IS_ROOT, reason="a listener of its own mount namespace needs root")
def test_a_listener_starts_from_a_checkout_under_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener's mount namespace replaces /tmp with its own directory: a host script that
    lives in a checkout under /tmp (a CI clone, say) is copied into the listener's directory
    first, or the listener could not start (found by a fresh clone under /tmp)."""
    checkout = Path(tempfile.mkdtemp(prefix="hm-checkout-", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="hm-office-work-"))
    os.chmod(work, 0o755)
    script = checkout / "office_host.py"
    shutil.copyfile(office.HOST_SCRIPT, script)
    monkeypatch.setattr(office, "HOST_SCRIPT", script)

    async def go() -> None:
        pool = OfficePool(work / "office", [(LISTENER_UID, LISTENER_UID)], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            assert pool.listeners[0].running
            source = work / "doc.odt"
            source.write_bytes(ODT_TEXT)
            done = await pool.convert(source, ODT_MIME, 60)
            assert "hello from a listener test" in pdf_text(done.pdf)
        finally:
            await pool.close()

    try:
        asyncio.run(go())
    finally:
        shutil.rmtree(checkout)
        shutil.rmtree(work)


def test_a_cancelled_conversion_kills_its_listener_and_the_next_one_works(tmp_path: Path) -> None:
    """A job cancelled mid-conversion (the runtime cancels its stage): the listener is killed at
    once, not left inside the document; the next conversion restarts it."""
    os.chmod(tmp_path, 0o755)
    slow = tmp_path / "long.odt"
    slow.write_bytes(long_odt(20_000))
    small = tmp_path / "doc.odt"
    small.write_bytes(ODT_TEXT)

    async def go() -> None:
        pool = OfficePool(tmp_path / "office", [None], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        try:
            [listener] = pool.listeners
            host = listener.pid
            conversion = asyncio.create_task(pool.convert(slow, ODT_MIME, 120))
            await asyncio.sleep(2)
            conversion.cancel()
            with pytest.raises(asyncio.CancelledError):
                await conversion
            assert not listener.running
            assert host is not None
            deadline = asyncio.get_running_loop().time() + 5
            while _alive(host):  # SIGKILLed; gone as soon as the kernel has delivered it
                assert asyncio.get_running_loop().time() < deadline, "the listener outlived its cancel"
                await asyncio.sleep(0.05)
            done = await pool.convert(small, ODT_MIME, 60)
            assert "hello from a listener test" in pdf_text(done.pdf)
            assert listener.starts == 2
        finally:
            await pool.close()

    asyncio.run(go())


def _alive(pid: int) -> bool:
    """True while ``pid`` runs and is not a zombie."""
    try:
        return status(pid).get("State", "Z").split()[0] != "Z"
    except OSError:
        return False


def test_a_conversion_cancelled_while_its_listener_starts_leaves_no_half_started_listener(
    tmp_path: Path,
) -> None:
    """Cancelled during the listener's start (the first conversion starts it): the half-started
    host is killed, so the next conversion does not take its "ready" line for a reply."""
    os.chmod(tmp_path, 0o755)
    small = tmp_path / "doc.odt"
    small.write_bytes(ODT_TEXT)

    async def go() -> None:
        pool = OfficePool(tmp_path / "office", [None], config.load(OfficeSettings))
        try:  # not started: the conversion starts the listener itself
            conversion = asyncio.create_task(pool.convert(small, ODT_MIME, 60))
            await asyncio.sleep(0.3)
            conversion.cancel()
            with pytest.raises(asyncio.CancelledError):
                await conversion
            assert not pool.listeners[0].running
            done = await pool.convert(small, ODT_MIME, 60)
            assert "hello from a listener test" in pdf_text(done.pdf)
        finally:
            await pool.close()

    asyncio.run(go())
