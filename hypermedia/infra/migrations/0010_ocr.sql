-- OCR on queue `ocr` (issue 6; the ocrworker): the `ocr` operation reads images (multi-page TIFF
-- included) and PDFs with tesseract, escalating pages of low confidence to RapidOCR.
--
-- Prices are millicredits: base + per MiB of the input, as every operation, and a second line,
-- `ocr_escalation`: escalation_per_page for each page RapidOCR read again. The gateway holds
-- the base price plus escalation_per_page for every page that could be escalated (the pages
-- asked for, or the job's page cap), the worker charges what happened: the base line and the
-- escalation line, each a ledger row of its own (credit_ledger.line).
-- timeout_seconds is the job's CPU budget (20 pages of tesseract, preprocessing and escalation
-- take ≈ 200 s at worst on the corpus pages); max_pixels bounds one page as decoded or rendered
-- (an A4 page at 300 dpi is 8.7 M pixels, a 600 dpi scan 35 M).
-- depends: 0009_job_secrets

ALTER TABLE processing_profiles
    ADD COLUMN escalation_per_page bigint NOT NULL DEFAULT 0 CHECK (escalation_per_page >= 0);

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds, escalation_per_page)
VALUES
    ('ocr', 1, 'ocr', 1500, 300, 300, 3, 104857600, 64000000, 2048, 60, ARRAY['image', 'pdf'], 300);

-- Charge lines: a job's commit is one ledger row per line ('base', 'ocr_escalation'); holds,
-- releases and grants have the line 'base'.
ALTER TABLE credit_ledger ADD COLUMN line text NOT NULL DEFAULT 'base';
ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_job_kind;
ALTER TABLE credit_ledger ADD CONSTRAINT credit_ledger_job_kind_line UNIQUE (job_id, kind, line);

-- The extra lines a completed job is charged beside its base price, {"ocr_escalation": 600}
-- (millicredits), written with actual_credits (their sum included) so that the reaper charges
-- them too when the worker's Commit failed.
ALTER TABLE processing_jobs ADD COLUMN charge_lines jsonb NOT NULL DEFAULT '{}';

-- The recognition languages each ocrworker process has installed, reported when it starts and
-- every hour; the gateway refuses an `ocr` job asking for one no worker reported in the last day.
CREATE TABLE ocr_languages (
    worker_id    text NOT NULL,
    language     text NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, language)
);
