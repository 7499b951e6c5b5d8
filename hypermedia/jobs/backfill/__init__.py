"""Backfill runs (issue 21 item 2, ADR 0058): an account regenerates the outputs of an operation
or of one of its presets on the bulk queue, paced and braked, without ever making a job twice.

A run is created with a :class:`Selector` (an operation with or without params, or a preset;
outdated outputs only or every object; the account's objects, narrowed by ids or a creation-time
range). Its **items** are the ``(object, params)`` pairs the selector matched at that moment
(:func:`candidates`), kept in ``backfill_items``; a dry run answers the same match and its price
(:func:`estimate`) and keeps nothing. The gateway's runner (``services/gateway/backfill_runner.py``)
then enqueues the items through job creation, one at a time, at priority 7-10 on the bulk lane of
the operation's engine, each under the idempotency key (object, operation, params hash, target
version) of :func:`idempotency_key`: a run restarted or repeated finds the key's job and links it
(``existing``) instead of making another. Each job's credits are held when it is enqueued, so a
run holds credits as it advances and pauses (``INSUFFICIENT_CREDITS``) when they run out.

States: ``running`` (items left to enqueue) → ``dispatched`` (every item enqueued, linked or
skipped; jobs still running) → ``completed`` (every job ended). ``paused`` by the caller or for a
reason (credits, a preset changed under the run); ``cancelled`` by the caller (its waiting jobs
cancelled); ``expired`` when its deadline passed with items not enqueued. Replaying a run's
failures puts the items whose job failed back to ``pending`` under a new key, and a dispatched or
completed run back to ``running``.

The runner's pacing: a token bucket at the run's ``rate_per_second`` (bursts of one second of
rate, at least one job), refilled from ``refilled_at`` (:func:`refill`), and a brake
(:func:`brake`) that holds every run while an interactive queue's oldest waiting job has waited
longer than that queue's target.
"""
