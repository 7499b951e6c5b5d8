"""Per-job sandbox: one forked, rlimited, unprivileged process per job, started from a warm zygote.

Shape::

    worker (asyncio) ──stdin: pickled requests──▶ zygote ──fork()──▶ child (one per job)
           ◀──stdout: JSON lines (started/exited)──   ◀──pipe: JSON report──

* The **zygote** is a separate Python process started once by :meth:`Sandbox.start`. It imports
  the preload modules (``pyvips``, ``hypermedia.engines.imaging.ops``) and never runs a libvips operation,
  so forking it is safe and cheap (a process that has *run* a libvips operation must not fork: the
  child deadlocks in libvips' thread pool). The asyncio worker never forks and never runs libvips.
  The zygote is single-threaded: a selector loop over its stdin, the children's report pipes and a
  SIGCHLD self-pipe. It reaps children with ``wait4`` (exit status and ``ru_maxrss`` even for a
  child killed by a signal), kills a job's process group only while the group leader is still
  unreaped (no pid-reuse race), and is a child subreaper, so orphaned grandchildren are reaped too.
  ``multiprocessing``'s forkserver was the alternative; it gives neither ``wait4`` rusage of the
  child nor race-free group kills, and its context is global per process.
* The **child** (see :func:`hypermedia.sandbox.child._child_main`) starts a new session (its own process group), optionally
  a new network namespace, sets ``RLIMIT_CPU`` (soft = timeout, hard = timeout + 1 s),
  ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` and ``RLIMIT_CORE`` = 0, drops to the sandbox
  uid/gid with no supplementary groups, sets ``no_new_privs`` and a parent-death signal, ``umask
  077``, ``chdir`` to the job dir, replaces the environment, keeps only stdin/stdout on
  ``/dev/null``, stderr and its report pipe, then calls the entry.
* **Threads and RLIMIT_NPROC**: the kernel counts every thread of every process of a uid against
  ``RLIMIT_NPROC``, across all slots that share the uid. Children run with ``VIPS_CONCURRENCY=1``
  (throughput comes from slots, one job per core; libheif/aom follow it too), which keeps an image
  job at 4 threads at its peak (measured by ``tests/unit/sandbox_entries.py:image_threads``).
  Under the default ``nproc=16``, one shared sandbox uid fits 4 image jobs at once; give the
  sandbox a pool of uids at least as large as the slots (``uid=range(...)``) for more, which
  also keeps one job's threads from starving another's. Without root there is no sandbox uid:
  jobs run as the worker's own uid, whose tasks (the worker's threads, the zygote, other jobs)
  all count, so the limit becomes "16 more than the uid has now" (:func:`hypermedia.sandbox.confine._uid_tasks`) — a bound
  on a fork bomb, shared with concurrent jobs; the container's ``pids.max`` is the hard one.
* **Network**: with root, each child gets an empty network namespace (``unshare(CLONE_NEWNET)``);
  measured cost about 1.5 ms per job, so it is on by default (``isolate_network``).
* **Files**: the job dir is the only place the child can write. Its uid owns nothing else, and
  with root each child also gets a mount namespace (``unshare(CLONE_NEWNS)``) in which the
  world-writable directories (:data:`SHARED_WRITABLE_DIRS`: ``/tmp``, ``/var/tmp``, ``/dev/shm``,
  …) are empty read-only tmpfs mounts — the job dir, when it lies under one of them, is
  bind-mounted back in place, and so are the Python environment, the standard library and the
  checkout, read-only (:func:`hypermedia.sandbox.confine._code_dirs`); a directory others may not search on the way to
  those (``/root`` holding a pyenv Python) is covered the same way (:func:`hypermedia.sandbox.confine._covered_dirs`). Without root (or where the namespace is refused) those directories
  stay writable to the job; the report says so and the worker logs it once.
* **Cgroups** (:mod:`hypermedia.sandbox.cgroups`, ``Sandbox(cgroups="auto")``): where a subtree
  is delegated, the zygote makes one group per job before the fork (memory limit, swap 0,
  ``pids.max``, group OOM kill; v1 or v2) and the child joins it as its very first step; after
  the job the zygote reads the peak and OOM record, kills what is left in the group and removes
  it. Elsewhere the rlimits alone bound the job.
* The **result** travels as JSON only (a child handles hostile input; its report is parsed as
  data, never unpickled), at most :data:`MAX_REPORT_BYTES`. Outputs are rebuilt as
  :class:`~hypermedia.engines.contract.OutputFile` and must be regular files (not symlinks) directly inside ``output/``.

Modules: :mod:`~hypermedia.sandbox.host` (the worker side: :class:`Sandbox`, reading outputs and
progress), :mod:`~hypermedia.sandbox.results` (:class:`SandboxLimits`, :class:`SandboxResult`),
:mod:`~hypermedia.sandbox.zygote` (the zygote and the per-job child),
:mod:`~hypermedia.sandbox.confine` (namespaces, rlimits, the uid drop), :mod:`~hypermedia.sandbox.seccomp`
(the job's system-call filter), :mod:`~hypermedia.sandbox.cgroups` (per-job cgroups; where they
are: :mod:`~hypermedia.sandbox.cgroupfind`), :mod:`~hypermedia.sandbox.layers` (what holds,
probed at start), :mod:`~hypermedia.sandbox.helper`
(confined long-lived helpers such as LibreOffice) and :mod:`~hypermedia.sandbox.landlock`. The engine
contract (what an entry returns, progress) is :mod:`hypermedia.engines.contract`: engines never import
the sandbox.
"""

from hypermedia.engines.contract import PROGRESS_FILE, OutputFile, report_progress
from hypermedia.sandbox.confine import SHARED_WRITABLE_DIRS, kill_uid, make_undumpable
from hypermedia.sandbox.helper import confined_exec_main
from hypermedia.sandbox.host import (
    DEFAULT_CHILD_ENV,
    MAX_REPORT_BYTES,
    ZYGOTE_RESTARTS_PER_RUN,
    ZYGOTE_START_SECONDS,
    Sandbox,
    SandboxLimits,
    SandboxResult,
)
from hypermedia.sandbox.outputs import open_output, read_output, read_progress

__all__ = [
    "DEFAULT_CHILD_ENV",
    "MAX_REPORT_BYTES",
    "PROGRESS_FILE",
    "SHARED_WRITABLE_DIRS",
    "ZYGOTE_RESTARTS_PER_RUN",
    "ZYGOTE_START_SECONDS",
    "OutputFile",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "confined_exec_main",
    "kill_uid",
    "make_undumpable",
    "open_output",
    "read_output",
    "read_progress",
    "report_progress",
]
