-- Office documents on queue `documents` (issue 5, office part; the docworker): office_to_pdf
-- converts DOCX, XLSX, PPTX, ODT, ODS, ODP, RTF, DOC, XLS and PPT (input kind 'office') to PDF
-- with a warm LibreOffice listener; text_extract version 2 also accepts office documents (it
-- extracts the text of the converted PDF). Prices are millicredits (base + per MiB of the input).
-- timeout_seconds bounds the LibreOffice conversion and, separately, the PDFium step after it
-- (a conversion still running at the timeout is killed and its listener restarted).
-- memory_limit_mb is the PDFium step's RLIMIT_AS; the listener has its own (HM_OFFICE_MEMORY_MB).
-- max_pixels keeps the column's default: nothing is rendered.
-- depends: 0007_document_profiles

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds)
VALUES
    ('office_to_pdf', 1, 'documents', 2000, 500, 120, 3, 104857600, DEFAULT, 2048, 60, ARRAY['office']);

UPDATE processing_profiles SET active = false WHERE operation = 'text_extract' AND version = 1;

INSERT INTO processing_profiles
    (operation, version, queue, base_cost, per_mb, timeout_seconds, max_attempts, max_input_bytes,
     max_pixels, memory_limit_mb, backoff_base_seconds, input_kinds)
VALUES
    ('text_extract', 2, 'documents', 500, 100, 120, 3, 104857600, DEFAULT, 2048, 60, ARRAY['pdf', 'office']);
