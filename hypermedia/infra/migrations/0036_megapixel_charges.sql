-- Image operations charged the megapixels they read (issue 23 item 3, ADR 0068): a completed
-- thumbnail, resize, compress or convert is charged base_cost + per_unit × the megapixels of the
-- source image it read (its first frame: the outputs' source_width × source_height), never
-- more than its price by size (hypermedia/jobs/charges.py). Values in millicredits.
-- depends: 0035_object_facts

ALTER TABLE processing_profiles DROP CONSTRAINT processing_profiles_work_unit_check;
ALTER TABLE processing_profiles
    ADD CONSTRAINT processing_profiles_work_unit_check CHECK (work_unit IN ('page', 'media_second', 'megapixel'));

-- The per-megapixel price is the per-MB price at 0.25 bytes a pixel (an assumption: a camera
-- JPEG, 12 MP in about 3 MB), so such a photo is charged about what its bytes held and an image
-- with more bytes a pixel (a PNG, a TIFF) by its pixels. A photo compressed harder is cut to its
-- hold: the corpus's landscape photos are 0.16 bytes a pixel (2.16 MP in 0.35 MB).
UPDATE processing_profiles SET work_unit = 'megapixel', per_unit = 50 WHERE operation IN ('thumbnail', 'resize');
UPDATE processing_profiles SET work_unit = 'megapixel', per_unit = 75 WHERE operation IN ('compress', 'convert');
