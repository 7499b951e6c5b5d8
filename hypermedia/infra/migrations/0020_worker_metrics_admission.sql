-- The admission state in every worker_metrics row (issue 19: status in GetStatus, the log and a
-- metric): the jobs the worker admitted at once at the sample (control's target for a worker
-- unit's execution, NULL for a worker on its own, which admits up to its slots) and why admission
-- was open or closed (GetStatus.reason: ok, slots_full, parked, memory_pressure, ...).
-- depends: 0019_worker_unit_leases

ALTER TABLE worker_metrics
    ADD COLUMN admission_target integer,
    ADD COLUMN admission_reason text;
