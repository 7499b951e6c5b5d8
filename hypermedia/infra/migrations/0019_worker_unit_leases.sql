-- The deployment lease of a worker unit (issue 19, seed 001, ADR 0046): one live unit per
-- (deployment, unit). Control takes the row at start; its epoch goes up by one at every taking, so
-- a message or a process from an earlier boot is told apart by its epoch. A live row (not released,
-- expires_at ahead) refuses a second unit of the same name; control renews it every third of its
-- time to live and lets it go when it stops (hypermedia/worker/unit/lease.py).
-- depends: 0018_noop_profile

CREATE TABLE worker_unit_leases (
    deployment   text NOT NULL,
    unit         text NOT NULL,
    epoch        bigint NOT NULL CHECK (epoch >= 1),
    boot_id      text NOT NULL,
    holder       text NOT NULL,
    acquired_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    released_at  timestamptz,
    PRIMARY KEY (deployment, unit)
);
