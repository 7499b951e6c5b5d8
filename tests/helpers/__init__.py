"""Builders and checks the test suites share (documents, media, images, renders); no tests here."""
