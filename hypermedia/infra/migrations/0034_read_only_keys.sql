-- Read-only API keys (issue 22 item 6): a key that reads the account (REST GETs, gRPC Get/List/
-- Watch/Estimate, the dashboard) and changes nothing (403 READ_ONLY_KEY).
ALTER TABLE api_keys ADD COLUMN read_only boolean NOT NULL DEFAULT false;
