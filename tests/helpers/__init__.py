"""Test helpers shared across test folders: small fakes of what a test cannot run here (:mod:`.fakes`)."""
