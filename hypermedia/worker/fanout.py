"""The worker's side of a job that fans out (issue 23 item 2, ADR 0081).

A ``transcode_video`` entry that finds its video long enough
(:attr:`~hypermedia.engines.media.sources.MediaLimits.fan_out_seconds`) and cut into at least
:data:`MIN_CHUNKS` chunks encodes nothing: it returns one output, :data:`OUTPUT` ("fan out into
this many chunks", :func:`requested`). The runtime then, in the same attempt:

1. creates one child job per chunk but the last (:func:`hypermedia.jobs.lifecycle.children.spawn`,
   fenced by the attempt; any worker of the queue claims them, this one included);
2. parks the job (:meth:`Parked.wait`): its slot is given up meanwhile, so the children can run
   here too; its lease is still extended; the job's progress is its children's, summed; a cancel
   of the job (which cancels its children) or a drain stops the wait as it stops any step;
3. once every child ended, however, takes a slot again as soon as one is free (none is given
   to a new job meanwhile), gets a fresh grant (every chunk a
   child kept is now a checkpoint part of the job) and runs the entry a second time without
   fanning out: it takes the kept chunks, encodes the last one and any a child did not keep, and
   joins them (:func:`hypermedia.engines.media.chunk_parts.encode_in_chunks`).

As soon as a child fails because of its input (:class:`ChildFailed`), the job fails with the
child's error instead, charged as a job that failed because of its input; its trigger stops the
other children.

A later attempt of a job that fanned out (a drain hands a parked job back at once; a lost lease)
waits for the children still running before it is granted and downloads anything, so that it
restores every part they kept, and never fans out again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import asyncpg

from hypermedia.core.errors import PermanentJobError, TransientError
from hypermedia.engines.contract import FAN_OUT
from hypermedia.infra import db
from hypermedia.jobs.lifecycle import ClaimedJob, children
from hypermedia.sandbox import SandboxResult
from hypermedia.worker.admission import Admission
from hypermedia.worker.progress import PROCESSING_PROGRESS

OUTPUT: Final = FAN_OUT
"""The output type of an entry's request to fan out; its metadata ``chunks`` is the plan's count
(:func:`hypermedia.engines.contract.fan_out_request`)."""
MIN_CHUNKS: Final = 3
"""Fewest chunks worth fanning out: two children beside the parent's own last chunk."""
MAX_CHUNKS: Final = 60
"""Most chunks of a plan (:data:`hypermedia.engines.media.chunk_parts.MAX_CHUNKS`)."""
POLL_SECONDS: Final = 1.0
"""How often a parked job looks at its children."""


class ChildFailed(PermanentJobError):
    """A child of the job failed because of its input (:attr:`children.Children.failure`): the
    job fails at once with the child's error code, and is charged as a job that failed because
    of its input (its trigger stops the children still running). Doing the child's part itself
    would meet the same input, after up to its whole timeout."""

    def __init__(self, failure: children.Failure) -> None:
        super().__init__(
            f"part {failure.chunk_index + 1}, done by a child job, failed: {failure.error_message}",
            failure.error_code,
        )


def requested(result: SandboxResult, job: ClaimedJob) -> int | None:
    """The chunks the entry's plan has when ``result`` asks to fan out ``job``, else None. The
    entry ran on a hostile file: the count is checked, and a request beside other outputs, out
    of bounds, or from a job that may not fan out (a child, a job that fanned out before: its
    entry was told not to) is an internal error (retried), never children made from it.

    Raises:
        TransientError: ``INTERNAL`` for a malformed or forbidden request.
    """
    asks = [o for o in result.outputs if o.output_type == OUTPUT]
    if not asks:
        return None
    count = asks[0].metadata.get("chunks")
    if len(result.outputs) != 1 or type(count) is not int or not MIN_CHUNKS <= count <= MAX_CHUNKS:
        raise TransientError("the entry asked to fan out with a malformed request", "INTERNAL")
    if job.fanned_out or job.parent_job_id is not None:
        raise TransientError("the entry asked to fan out a job that may not", "INTERNAL")
    return count


def clear_outputs(job_dir: Path) -> None:
    """Empties the job's ``output/`` (the first run's request) for the entry's second run."""
    for entry in (job_dir / "output").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class Parked:
    """A worker's parked jobs (step 2 of the module doc).

    Args:
        pool: the system of record.
        admission: the worker's slots; a parked job gives its slot back.
        slot_free: set when a slot is given back, to wake the fetch loop.
        report: records a progress event of a job, ``(job, fraction, stage)``.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        admission: Admission,
        slot_free: asyncio.Event,
        report: Callable[[ClaimedJob, float, str], Awaitable[None]],
    ) -> None:
        self._pool = pool
        self._admission = admission
        self._slot_free = slot_free
        self._report = report
        self.jobs: set[str] = set()
        """The jobs parked now, waiting for their children."""

    async def wait(self, job: ClaimedJob) -> None:
        """Until every child of ``job`` ended: the job's slot is free meanwhile (the job is in
        :attr:`jobs`, which a drain hands back at once), and its progress is ``(children's work
        done) / (children + 1)`` of the entry's span (the parent's own last chunk and the join
        being the one more), stage ``children``. Then the job holds a slot's place
        (:attr:`Admission.unparking`: the fetch loop takes no job in its place) until a slot is
        free within the worker's limit, and takes it. The slot is taken back whatever stops the
        wait (a cancel, a drain), so that the runtime's release at the job's end stays balanced.

        Raises:
            ChildFailed: a child failed because of its input (as soon as one has).
        """
        low, high = PROCESSING_PROGRESS
        if (await self._state(job)).all_ended:  # a later attempt after they ended: keep the slot
            return
        self._admission.busy -= 1
        self._slot_free.set()
        self.jobs.add(job.job_id)
        reserved = taken = False
        try:
            last = -1.0
            while True:
                state = await self._state(job)
                fraction = state.done / (state.total + 1)
                if fraction > last:
                    await self._report(job, low + (high - low) * fraction, "children")
                    last = fraction
                if state.all_ended:
                    break
                await asyncio.sleep(POLL_SECONDS)
            self._admission.unparking += 1
            reserved = True
            while self._admission.busy >= self._admission.limit:  # woken when a job ends
                self._slot_free.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_free.wait(), POLL_SECONDS)
            self._admission.busy += 1  # no await since the check: the slot is this job's
            taken = True
        finally:
            self.jobs.discard(job.job_id)  # parked until it has its slot: a drain hands it back
            if reserved:
                self._admission.unparking -= 1
            if not taken:
                self._admission.busy += 1

    async def _state(self, job: ClaimedJob) -> children.Children:
        """Where ``job``'s children are, read across a Postgres restart (as every lifecycle read).

        Raises:
            ChildFailed: one of them failed because of its input.
        """
        async for attempt in db.retrying():
            with attempt:  # ChildFailed is not transient: raised at once, never retried
                state = await children.state(self._pool, job.job_id)
                if state.failure:
                    raise ChildFailed(state.failure)
                return state
        raise AssertionError("unreachable: retrying() re-raises")
