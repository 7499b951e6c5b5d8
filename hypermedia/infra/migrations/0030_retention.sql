-- Retention (issue 24 item 2, hypermedia/jobs/retention.py): the reaper deletes the oldest
-- worker_metrics and finished webhook deliveries past their retention, a batch at a time; these
-- indexes find the oldest without a scan. (job_events are found by their primary key: event_id
-- grows with created_at.)
-- depends: 0029_job_checkpoints

CREATE INDEX worker_metrics_recorded_idx ON worker_metrics(recorded_at);
CREATE INDEX webhook_deliveries_finished_idx ON webhook_deliveries(created_at) WHERE status <> 'pending';
