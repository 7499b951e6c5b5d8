"""Builders, checks and small fakes the test suites share (documents, media, images, renders; fakes of
what a test cannot run here: :mod:`.fakes`); no tests here."""
