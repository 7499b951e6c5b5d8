-- Charges for the work done (issue 23 item 3, ADR 0068). The hold stays the seed's price
-- (base_cost + per_mb × size_mb), an upper bound; a completed job of an operation with a
-- `work_unit` is charged base_cost + per_unit × the units it did (pages rendered or read, seconds
-- of media written summed over the renditions), never
-- more than that price (hypermedia/jobs/charges.py). Operations without one are charged their
-- price, the bytes they read being their measure. Values in millicredits.
-- depends: 0027_running_cap

ALTER TABLE processing_profiles
    ADD COLUMN work_unit text CHECK (work_unit IN ('page', 'media_second')),
    ADD COLUMN per_unit  integer NOT NULL DEFAULT 0 CHECK (per_unit >= 0);

-- A page rendered at preview size costs about as much CPU as 0.25 MiB of an image thumbnailed;
-- a page read by tesseract about a second and a half of CPU (docs/performance.md).
UPDATE processing_profiles SET work_unit = 'page', per_unit = 50 WHERE operation = 'pdf_preview';
UPDATE processing_profiles SET work_unit = 'page', per_unit = 200 WHERE operation = 'ocr';
-- A second of media written, per rendition: an x264 rendition encodes at about real time on one
-- core at 720p; an AAC or Opus second is a fraction of that.
UPDATE processing_profiles SET work_unit = 'media_second', per_unit = 10 WHERE operation = 'transcode_video';
UPDATE processing_profiles SET work_unit = 'media_second', per_unit = 1 WHERE operation = 'transcode_audio';

-- An account's ledger, newest first (credits ListLedger, GET /v1/account/ledger): what explains
-- each charge line by line.
CREATE INDEX credit_ledger_account_idx ON credit_ledger(account_id, entry_id);
