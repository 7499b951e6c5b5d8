-- Document operations on queue `documents` (issue 5, PDF part; the docworker): pdf_info,
-- pdf_preview and text_extract accept input kind 'pdf'. Prices are millicredits (base + per MiB of
-- the input). max_pixels is pdf_preview's per-page pixel budget (an A4 or Letter page at 600 dpi
-- is 35 M pixels); pdf_info and text_extract render nothing and keep the column's default.
-- memory_limit_mb is the sandbox's RLIMIT_AS of a job (PDFium aborts above it: RESOURCE_LIMIT).
-- The page limit (10,000) and the other bounds are constants in hypermedia/documents/.
-- depends: 0006_upload_validation

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds)
VALUES
    ('pdf_info',     1, 'documents',  200,  20, 30, 3, 104857600, DEFAULT,  2048, 60, ARRAY['pdf']),
    ('pdf_preview',  1, 'documents', 1000, 200, 60, 3, 104857600, 40000000, 2048, 60, ARRAY['pdf']),
    ('text_extract', 1, 'documents',  500, 100, 60, 3, 104857600, DEFAULT,  2048, 60, ARRAY['pdf']);
