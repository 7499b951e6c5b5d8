-- What jobs learned about an input while reading it (hypermedia.jobs.facts, issue 22 item 3):
-- {"width", "height", "pages", "media_seconds"}, kept by storage's RegisterOutputs so an estimate
-- of a later job on the object fits run times on pixels, pages or media seconds, not bytes.
ALTER TABLE objects ADD COLUMN facts jsonb;
