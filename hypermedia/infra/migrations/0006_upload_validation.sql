-- Upload validation (issue 4): an original's type is decided from its content (objects.mime_type);
-- what the client claimed is recorded beside it, never trusted. claimed_mime_type is the multipart
-- part's Content-Type and name_mime_type the type the file name's extension implies (both
-- normalised; NULL when absent, generic or unknown); type_mismatch is true when either names
-- another type than mime_type. objects.filename holds the sanitised display name.
-- depends: 0005_request_job_order

ALTER TABLE objects
    ADD COLUMN claimed_mime_type text,
    ADD COLUMN name_mime_type text,
    ADD COLUMN type_mismatch boolean NOT NULL DEFAULT false;
