"""Office documents → PDF with warm LibreOffice listeners (the docworker's ``office_to_pdf``, and
the first step of ``text_extract`` on an office document).

Shape::

    worker (asyncio) ──stdin: JSON lines──▶ confined launcher ─execve─▶ office_host.py ──UNO pipe──▶ soffice
                     ◀──stdout: JSON lines──                              (system Python + uno)

* One :class:`OfficeListener` per slot (:class:`OfficePool`): a conversion host
  (:mod:`hypermedia.engines.documents.office_host`) that keeps one ``soffice --headless`` running and
  converts one document at a time. Starting LibreOffice costs about two seconds; a warm listener
  converts a one-page document in about 0.05 s (``bench/office_to_pdf.py``, docs/performance.md).
* **Confinement** (:func:`hypermedia.sandbox.confined_exec_main`): with root, a listener runs as a
  uid of its own (never a job's), in an empty network namespace (no remote resource can be
  fetched) and a mount namespace where the shared temp directories are hidden and ``/tmp`` is its
  own directory; ``RLIMIT_AS`` (``HM_OFFICE_MEMORY_MB``), ``RLIMIT_NPROC``,
  ``RLIMIT_FSIZE``, no core dumps, ``no_new_privs``. With or without root, a Landlock ruleset
  (:func:`listener_view`, docs/adr/0027) limits the files it can open to LibreOffice, Python,
  fonts, LibreOffice's configuration and its own directory, so a document that makes LibreOffice
  load a host file finds nothing to read. Without root it keeps the worker's uid, no namespaces.
* **Throwaway profile**: each start gets a fresh directory (profile, ``/tmp``, input, output),
  removed when the listener stops; the profile disables macros outright and blocks links from
  untrusted documents (see ``office_host.REGISTRY``). Documents are opened hidden, read-only,
  with ``MacroExecutionMode`` NEVER_EXECUTE, ``UpdateDocMode`` NO_UPDATE and the import filter
  named by the upload's identified type (:data:`~hypermedia.engines.documents.filters.IMPORT_FILTERS`;
  for legacy Word, Excel and PowerPoint, the one of the version its header says,
  :func:`~hypermedia.engines.documents.filters.import_filter`), so a file is never
  sniffed into another format (HTML, say) by LibreOffice itself.
* **Linked content**: before a listener sees a document, :mod:`hypermedia.engines.documents.links` looks
  in every part of it, and of the packages inside it, for what would load a file or URL (ODF
  ``xlink:href`` outside the package, external OOXML relationships, ``INCLUDEPICTURE``-like fields
  in Word and RTF, DDE links); such a document is
  ``LINKED_CONTENT_NOT_ALLOWED``. LibreOffice's own settings do not stop all of them (an RTF
  ``INCLUDEPICTURE`` and an ODT paragraph background image were drawn from host files).
* **Restarts**: after ``HM_OFFICE_MAX_CONVERSIONS`` conversions; after a conversion that
  did not answer within the job's timeout (the listener's process group is killed: ``TIMEOUT``,
  permanent — the same document would hang again); after LibreOffice died or failed on a document
  (``OFFICE_CRASHED``, permanent for the same reason); when a cancelled job's conversion is cut
  short; and when the process has died. The next conversion starts it again. A
  listener that cannot start falls back to a **cold** listener for that one document (started,
  used once, stopped).
* Input and output cross through the listener's directory (the worker's, like its ``input/``; the
  listener owns only ``tmp/``, ``profile/`` and ``output/``): the worker copies the input into
  ``input/`` (read-only to the listener, so nothing can be planted there for the worker to write
  through) and reads the PDF back from ``output/`` with ``O_NOFOLLOW`` at every
  step (:func:`hypermedia.sandbox.read_output`), so a compromised listener cannot make the worker
  read or write another file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hypermedia.core.errors import PermanentJobError, TransientError
from hypermedia.engines.documents import links
from hypermedia.engines.documents.filters import import_filter
from hypermedia.engines.documents.settings import OfficeSettings
from hypermedia.sandbox import kill_uid, landlock, read_output

__all__ = [
    "HOST_SCRIPT",
    "Conversion",
    "OfficeListener",
    "OfficePool",
    "listener_view",
]

log = logging.getLogger(__name__)

HOST_SCRIPT: Final = Path(__file__).with_name("office_host.py")


MAX_PDF_BYTES: Final = 1 << 30
"""Largest PDF a conversion may ever produce (a bigger one is ``RESOURCE_LIMIT``); the docworker
passes the profile's ``max_input_bytes``, the limit the PDF step holds its input to."""


LISTENER_READ_PATHS: Final = (
    "/etc/fonts",
    "/etc/libreoffice",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/var/cache/fontconfig",
    "/var/lib/libreoffice",
    "/var/spool/libreoffice",
    "/dev/urandom",
    "/dev/random",
    "/proc/filesystems",
    "/sys/devices/system/cpu",
)
"""What a listener reads outside its program directories (measured with ``strace -f`` on a
conversion, LibreOffice 7.4 on Debian 12): fontconfig's configuration and cache, LibreOffice's
configuration (``/usr/lib/libreoffice/share/registry`` and ``program/sofficerc`` link into
``/etc/libreoffice``, the bundled extensions into ``/var/lib`` and ``/var/spool``), the dynamic
loader's cache, the time zone, the user and group databases (the user's name; no passwords
there), random bytes, and the CPU count. The fonts themselves (``/usr/share/fonts``, among them the
Noto CJK and Noto core faces of the scripts other than Latin) and fontconfig's ``conf.avail`` are
under ``/usr``; with the system cache readable a listener writes no fontconfig cache of its own
(``tests/integration/test_office_scripts.py`` checks both)."""


def listener_view(directory: Path, settings: OfficeSettings) -> list[tuple[str, int]]:
    """The Landlock rules of a listener (``[path, access]`` pairs for
    :func:`hypermedia.sandbox.confined_exec_main`): everything it may open. Read and execute:
    ``/usr`` and the installation directories of ``settings.python`` and ``settings.soffice``
    (the parent of their ``bin/`` or ``program/`` directory, symlinks resolved); read:
    :data:`LISTENER_READ_PATHS` and ``settings.read_paths``; read and write: ``/dev/null`` and
    the listener's ``directory`` (its input, profile, private ``/tmp`` and output); and creating
    and removing Unix sockets in ``/tmp``, for when it is the host's (no mount namespace: a
    worker without root): LibreOffice's UNO pipe is a socket there whatever ``TMPDIR`` says, and
    it does not start without also removing files there (measured: without ``REMOVE_FILE`` the
    listener does not come up). No file in the host's ``/tmp`` can be read, written or renamed
    elsewhere (no ``REFER`` there); one the uid owns could be unlinked."""
    programs = {"/usr"} | {
        str(Path(os.path.realpath(p)).parents[1]) for p in (settings.python, settings.soffice)
    }
    rules = [(p, landlock.READ_EXECUTE) for p in sorted(programs)]
    rules += [(p, landlock.READ) for p in LISTENER_READ_PATHS]
    rules += [(p, landlock.READ) for p in settings.read_paths.split(":") if p]
    rules += [("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE), (str(directory), landlock.READ_WRITE)]
    rules.append(("/tmp", landlock.MAKE_SOCK | landlock.REMOVE_FILE))
    return rules


@dataclass(frozen=True)
class Conversion:
    """A finished conversion."""

    pdf: bytes
    """The PDF LibreOffice exported."""
    pages: int
    """Pages as LibreOffice laid the document out (Writer, Impress, Draw; 0 for spreadsheets,
    whose printed page count only the PDF knows)."""
    seconds: float
    """Wall time of the conversion (not counting a listener start)."""
    warm: bool
    """False when the listener had to be started for this conversion."""


class OfficeListener:
    """One warm LibreOffice (a confined conversion host) converting one document at a time.

    Args:
        name: unique within the worker (a directory and pipe name part), e.g. ``slot0``.
        base_dir: parent of the listener's directory ``{base_dir}/{name}/`` (recreated at each
            start); every ancestor must be searchable by ``uid``.
        uid: ``(uid, gid)`` of the listener (needs root), or ``None`` to keep the worker's.
        settings: see :class:`hypermedia.engines.documents.settings.OfficeSettings`.
    """

    def __init__(
        self, name: str, base_dir: Path, uid: tuple[int, int] | None, settings: OfficeSettings
    ) -> None:
        self.name = name
        self.dir = Path(base_dir).absolute() / name
        self.uid = uid
        self.settings = settings
        self.conversions = 0
        """Conversions since the current start."""
        self.starts = 0
        """How often the listener was started (restarts + 1, after the first start)."""
        self.soffice_pid: int | None = None
        """The running LibreOffice's pid (its launcher script's; ``soffice.bin`` is a descendant)."""
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        """The conversion host's pid while it runs (the leader of the listener's process group)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Starts the host and waits until LibreOffice accepts connections.

        Raises:
            TransientError: ``OFFICE_UNAVAILABLE`` when it does not come up within
                ``settings.start_timeout`` (its stderr goes to the worker's).
        """
        await self.stop()  # also what a crashed worker's listener of this uid left running
        # The directory and input/ are the worker's (the listener may read them, not rename or
        # plant anything the worker would write through); tmp/, profile/ and output/ the listener's.
        # input/ is readable by the listener's group only: no other uid (a job, another
        # listener) may read the document being converted.
        self.dir.mkdir(mode=0o755, parents=True)
        (self.dir / "input").mkdir(mode=0o750 if self.uid else 0o700)
        # The host script runs from here: the checkout may lie under /tmp, which the listener's
        # mount namespace replaces with its own.
        script = self.dir / HOST_SCRIPT.name
        shutil.copyfile(HOST_SCRIPT, script)
        os.chmod(script, 0o644)
        if self.uid is not None:
            os.chown(self.dir / "input", -1, self.uid[1])
        for sub in ("tmp", "profile", "output"):
            (self.dir / sub).mkdir(mode=0o700)
            if self.uid is not None:
                os.chown(self.dir / sub, *self.uid)
        host_config = {
            "soffice": self.settings.soffice,
            "profile": str(self.dir / "profile"),
            "pipe": f"hm-office-{os.getpid()}-{self.name}-{secrets.token_hex(4)}",
            "start_timeout": self.settings.start_timeout,
        }
        spec = self.confinement([self.settings.python, "-I", str(script), json.dumps(host_config)])
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from hypermedia.sandbox.helper import confined_exec_main; confined_exec_main()",
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.conversions = 0
        self.starts += 1
        try:
            ready = await self._read(self.settings.start_timeout + 5)
        except TimeoutError:
            ready = None
        except asyncio.CancelledError:
            self._kill()  # half started: its first line would be taken for a conversion's reply
            raise
        if not ready or ready.get("event") != "ready":
            proc = self._proc
            await self.stop()
            log.warning(
                "office listener %s: the conversion host did not start (exit status %s; %s); its stderr "
                "is above in this log",
                self.name,
                proc.returncode if proc is not None else None,
                (ready or {}).get("message", "no ready line"),
            )
            raise TransientError("The document converter could not be started.", "OFFICE_UNAVAILABLE")
        self.soffice_pid = int(ready.get("soffice_pid") or 0) or None
        log.info("office listener %s ready (start %d)", self.name, self.starts)

    def confinement(self, argv: list[str]) -> dict[str, Any]:
        """The :func:`hypermedia.sandbox.confined_exec_main` spec that runs ``argv`` (an absolute
        program path first) confined as this listener: its uid, namespaces, limits, environment
        and Landlock view (:func:`listener_view`; None on a kernel without Landlock). The
        listener's directory must exist (:meth:`start` makes it).

        Raises:
            TransientError: ``OFFICE_UNAVAILABLE`` on a kernel without Landlock when
                ``HM_OFFICE_REQUIRE_LANDLOCK`` is set.
        """
        return {
            "landlock": self._view(),
            "argv": argv,
            "dir": str(self.dir),
            "uid": self.uid[0] if self.uid else None,
            "gid": self.uid[1] if self.uid else None,
            "private_tmp": str(self.dir / "tmp"),
            "isolate_network": self.uid is not None,
            "memory_bytes": self.settings.memory_mb << 20,
            "fsize_bytes": self.settings.fsize_mb << 20,
            "nproc": self.settings.nproc,
            "env": {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "HOME": str(self.dir / "tmp"),
                "TMPDIR": str(self.dir / "tmp"),
                "SAL_USE_VCLPLUGIN": "svp",
            },
        }

    def _view(self) -> list[tuple[str, int]] | None:
        """The listener's Landlock rules, or None on a kernel without Landlock (logged; refused
        with ``HM_OFFICE_REQUIRE_LANDLOCK``)."""
        if landlock.abi_version() == 0:
            if self.settings.require_landlock:
                log.error(
                    "office listener %s: the kernel has no Landlock and HM_OFFICE_REQUIRE_LANDLOCK is set",
                    self.name,
                )
                raise TransientError("The document converter could not be started.", "OFFICE_UNAVAILABLE")
            log.warning(
                "office listener %s: the kernel has no Landlock; LibreOffice may open any file its "
                "uid can (docs/security.md)",
                self.name,
            )
            return None
        return listener_view(self.dir, self.settings)

    def _kill(self) -> None:
        """SIGKILLs the listener's process group without waiting; :meth:`start` cleans up."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        """Kills the listener's process group (host and LibreOffice) and removes its directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        if self.uid is not None:
            # A process that left the group (setsid), or one a crashed worker left: the uid is
            # this listener's alone.
            kill_uid(self.uid[0])
        shutil.rmtree(self.dir, ignore_errors=True)

    async def convert(
        self, source: Path, import_filter: str, timeout: float, max_pdf_bytes: int = MAX_PDF_BYTES
    ) -> Conversion:
        """Converts ``source`` (opened with ``import_filter``) to PDF, starting the listener first
        when it is not running or has done its ``HM_OFFICE_MAX_CONVERSIONS``.

        Args:
            source: a file the worker may read (it is copied into the listener's directory).
            import_filter: a value of :data:`~hypermedia.engines.documents.filters.IMPORT_FILTERS` or
                :data:`~hypermedia.engines.documents.filters.LEGACY_IMPORT_FILTERS`.
            timeout: seconds the conversion may take (a listener start is not counted).
            max_pdf_bytes: largest PDF accepted (read into memory), at most :data:`MAX_PDF_BYTES`.

        Raises:
            PermanentJobError: ``PARSE_ERROR`` (LibreOffice cannot open it), ``UNSUPPORTED_FORMAT``
                (it opened as something that has no PDF export), ``TIMEOUT`` (no answer in
                ``timeout``: the listener is killed and restarted by the next conversion),
                ``RESOURCE_LIMIT`` (the PDF is larger than ``max_pdf_bytes``), ``OFFICE_CRASHED``
                (LibreOffice died or failed during the conversion, which a document can make it
                do every time: not retried; the listener restarts with the next conversion).
            TransientError: ``OFFICE_UNAVAILABLE`` (the listener did not start).
            asyncio.CancelledError: the caller cancelled; the listener is killed at once.
        """
        warm = True
        if not self.running or self.conversions >= self.settings.max_conversions:
            warm = False
            await self.start()
        assert self._proc is not None and self._proc.stdin is not None
        target = self.dir / "input" / "source"
        output = self.dir / "output" / "document.pdf"
        with contextlib.suppress(FileNotFoundError):
            output.unlink()
        await asyncio.to_thread(_copy_in, source, target, self.uid[1] if self.uid else None)
        request = {"input": str(target), "output": str(output), "filter": import_filter}
        started = time.monotonic()
        self.conversions += 1
        try:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            await self._proc.stdin.drain()
            reply = await self._read(timeout)
        except TimeoutError:
            log.warning(
                "office listener %s: conversion timed out after %.0f s; restarting", self.name, timeout
            )
            await self.stop()
            raise PermanentJobError(
                f"LibreOffice did not finish converting the document within {timeout:.0f} s.", "TIMEOUT"
            ) from None
        except (ConnectionError, OSError):
            reply = None
        except asyncio.CancelledError:
            # The job was cancelled mid-conversion: LibreOffice is somewhere inside the document.
            # Kill it now (no await: we are being cancelled); the next conversion starts it anew.
            self._kill()
            raise
        finally:
            target.unlink(missing_ok=True)
        seconds = time.monotonic() - started
        if reply is None or "ok" not in reply:
            await self.stop()
            raise PermanentJobError("LibreOffice crashed on the document.", "OFFICE_CRASHED")
        if not reply["ok"]:
            code = reply.get("code")
            if code == "PARSE_ERROR":
                raise PermanentJobError("LibreOffice could not open the document.", "PARSE_ERROR")
            if code == "UNSUPPORTED_FORMAT":
                raise PermanentJobError("The document has no PDF export.", "UNSUPPORTED_FORMAT")
            log.warning("office listener %s failed: %s; restarting", self.name, reply.get("message"))
            await self.stop()
            raise PermanentJobError("LibreOffice failed on the document.", "OFFICE_CRASHED")
        max_pdf_bytes = min(max_pdf_bytes, MAX_PDF_BYTES)
        try:
            pdf = await asyncio.to_thread(read_output, self.dir, "document.pdf", max_bytes=max_pdf_bytes + 1)
        except OSError:
            await self.stop()
            raise PermanentJobError("LibreOffice wrote no PDF for the document.", "OFFICE_CRASHED") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                output.unlink()
        if len(pdf) > max_pdf_bytes:
            raise PermanentJobError(f"The PDF is larger than {max_pdf_bytes} bytes.", "RESOURCE_LIMIT")
        return Conversion(pdf=pdf, pages=int(reply.get("pages") or 0), seconds=seconds, warm=warm)

    async def _read(self, timeout: float) -> dict[str, Any] | None:
        """The host's next JSON line; None at EOF or for a line that is not a JSON object."""
        assert self._proc is not None and self._proc.stdout is not None
        line = await asyncio.wait_for(self._proc.stdout.readline(), timeout)
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None


def _copy_in(source: Path, target: Path, gid: int | None) -> None:
    """Copies ``source`` to a new ``target``, never through an existing file or link: mode 0640
    with group ``gid`` (the listener's), or 0600 when the listener has the worker's uid."""
    target.unlink(missing_ok=True)
    mode = 0o640 if gid is not None else 0o600
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    if gid is not None:
        os.fchown(fd, -1, gid)
    with open(fd, "wb") as out, source.open("rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)


class OfficePool:
    """The worker's listeners: one per slot, so a running job always finds one free.

    Args:
        base_dir: parent of the listeners' directories.
        uids: one ``(uid, gid)`` per listener (root), or ``None`` per listener to keep the
            worker's uid; its length is the number of listeners.
        settings: see :class:`hypermedia.engines.documents.settings.OfficeSettings`.
    """

    def __init__(
        self, base_dir: Path, uids: Sequence[tuple[int, int] | None], settings: OfficeSettings
    ) -> None:
        self.settings = settings
        self.base_dir = Path(base_dir).absolute()
        self.listeners = [
            OfficeListener(f"slot{i}", self.base_dir, uid, self.settings) for i, uid in enumerate(uids)
        ]
        self._free: asyncio.Queue[OfficeListener] = asyncio.Queue()
        for listener in self.listeners:
            self._free.put_nowait(listener)
        self.cold_conversions = 0
        """Conversions done by a cold listener because a warm one could not start."""
        self._warming: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Starts every listener in the background and returns at once (a start takes seconds,
        longer than a service may take to start). A conversion waits for a listener that is
        still starting; one that fails to start is logged and started again by its next
        conversion."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o711)
        for listener in self.listeners:
            self._warming.append(asyncio.create_task(self._warm(listener), name=f"office-{listener.name}"))

    async def started(self) -> None:
        """Waits until every start begun by :meth:`start` has ended, started or not (benchmarks and
        tests that time or inspect warm listeners)."""
        await asyncio.gather(*self._warming, return_exceptions=True)

    async def _warm(self, listener: OfficeListener) -> None:
        await self._free.get()  # it is free: the pool was just made
        try:
            await listener.start()
        except Exception as exc:
            log.warning("office listener %s did not start: %s", listener.name, exc)
        finally:
            self._free.put_nowait(listener)

    async def close(self) -> None:
        """Stops every listener (and any start still running)."""
        for task in self._warming:
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        await asyncio.gather(*(lsn.stop() for lsn in self.listeners))

    async def convert(
        self, source: Path, mime_type: str, timeout: float, max_pdf_bytes: int = MAX_PDF_BYTES
    ) -> Conversion:
        """Converts ``source`` (an upload identified as ``mime_type``) to PDF on a free listener
        (waiting for one that is still starting); see :meth:`OfficeListener.convert` for the rest.

        Raises:
            PermanentJobError: ``UNSUPPORTED_FORMAT`` for a type without an import filter, or
                a legacy format or encrypted document
                :func:`~hypermedia.engines.documents.filters.import_filter` refuses;
                ``PARSE_ERROR`` for a legacy file it cannot read; ``LINKED_CONTENT_NOT_ALLOWED`` for a document that would load a file or URL
                (:func:`hypermedia.engines.documents.links.find_external_content`, checked before a
                listener sees it); ``PARSE_ERROR`` for one whose XML that check cannot read;
                ``RESOURCE_LIMIT`` for one nesting packages past ``links.MAX_NESTING`` or expanding past
                ``links.MAX_CHECKED_BYTES``; see
                :meth:`OfficeListener.convert` for the rest.
            TransientError: see :meth:`OfficeListener.convert`.
        """
        chosen = await asyncio.to_thread(import_filter, source, mime_type)
        try:
            external = await asyncio.to_thread(links.find_external_content, source, mime_type)
        except links.CheckLimitExceeded as exc:
            raise PermanentJobError(
                f"The document is too complex to check: {exc}.", "RESOURCE_LIMIT"
            ) from None
        except links.MalformedDocument:
            raise PermanentJobError("LibreOffice could not open the document.", "PARSE_ERROR") from None
        if external is not None:
            raise PermanentJobError(
                f"The document loads content from outside itself ({external}); embed it instead.",
                "LINKED_CONTENT_NOT_ALLOWED",
            )
        listener = await self._free.get()
        try:
            try:
                return await listener.convert(source, chosen, timeout, max_pdf_bytes)
            except TransientError as exc:
                if exc.error_code != "OFFICE_UNAVAILABLE":
                    raise
            # The warm listener could not start: one cold start for this document alone.
            self.cold_conversions += 1
            cold = OfficeListener(f"{listener.name}-cold", self.base_dir, listener.uid, self.settings)
            try:
                return await cold.convert(source, chosen, timeout, max_pdf_bytes)
            finally:
                await cold.stop()
        finally:
            self._free.put_nowait(listener)
