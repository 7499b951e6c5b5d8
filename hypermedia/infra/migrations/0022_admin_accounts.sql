-- Admin accounts (issue 20 item 7): an account whose API keys may read the operators' API
-- (REST /v1/admin/..., gRPC hypermedia.scheduler.v1.SchedulerAdminService). Made by
-- `hypermedia admin create-account --admin`; every other account is refused 403 there.
-- depends: 0021_scheduler

ALTER TABLE accounts ADD COLUMN is_admin boolean NOT NULL DEFAULT false;
