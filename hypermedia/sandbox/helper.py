"""The second entry point: a confined **long-lived** helper process (the docworker's LibreOffice
listeners) that applies the job sandbox's confinement and a Landlock view to itself, then
``execve``s the helper (:func:`confined_exec_main`)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import NoReturn

from hypermedia.sandbox import landlock
from hypermedia.sandbox.confine import _CLONE_NEWNET, _confine_files, _libc, _limit_and_drop


def confined_exec_main() -> NoReturn:
    """Entry of a confined **long-lived** helper process (``python -c``), such as the docworker's
    LibreOffice listener: applies the job sandbox's confinement to itself, then ``execve``s the
    helper. Unlike a job, it has no CPU limit (the caller enforces a wall-clock timeout per request)
    and keeps stdin/stdout/stderr (its request channel).

    ``argv[1]`` is a JSON object: ``argv`` (the program and its arguments; ``argv[0]`` an absolute
    path), ``dir`` (its working directory; must exist), ``uid``/``gid`` (``null``: keep the
    caller's; else needs root), ``private_tmp`` (a directory bind-mounted over ``/tmp``, or
    ``null``), ``isolate_network`` (bool), ``memory_bytes`` (``RLIMIT_AS``), ``fsize_bytes``,
    ``nproc`` (``RLIMIT_NPROC``, relative to the uid's tasks when the uid is kept), ``env``, and
    ``landlock``: ``null``, or a list of ``[path, access]`` (:class:`hypermedia.sandbox.landlock.Rule`):
    the only files the helper may open (:func:`hypermedia.sandbox.landlock.restrict_self`).

    Order as in :func:`_child_main`: network namespace, mount namespace, rlimits, drop to the uid
    (no supplementary groups), ``no_new_privs``, parent-death SIGKILL (set after the uid change,
    which clears it), then the Landlock ruleset, ``umask 077``. Exits 71 when a confinement step
    fails (namespaces refused are not failures: the helper runs without them, as jobs do; a
    Landlock ruleset given but refused is one), 127 when ``execve`` fails."""
    try:
        spec = json.loads(sys.argv[1])
        parent = os.getppid()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        if spec["isolate_network"]:
            _libc.unshare(_CLONE_NEWNET)
        if spec["uid"] is not None:
            _confine_files(spec["dir"], spec["private_tmp"])
        _limit_and_drop(spec["memory_bytes"], spec["fsize_bytes"], spec["nproc"], spec["uid"], spec["gid"])
        if os.getppid() != parent:
            os._exit(71)
        os.chdir(spec["dir"])  # before the ruleset: the path to it need not be in the view
        if spec.get("landlock") is not None:
            landlock.restrict_self(landlock.Rule(path, access) for path, access in spec["landlock"])
        os.umask(0o077)
    except BaseException:
        traceback.print_exc()
        os._exit(71)
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError:
        traceback.print_exc()
    os._exit(127)
