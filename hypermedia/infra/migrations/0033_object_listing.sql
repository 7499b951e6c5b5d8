-- An account's objects listed newest first (GET /v1/objects, storage ListObjects; issue 22):
-- the ownership rows of one account found by index, not by a scan of every account's.
CREATE INDEX object_ownership_account_idx ON object_ownership(account_id, object_id);
