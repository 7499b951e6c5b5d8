"""JSON Schemas (draft 2020-12) of every operation's ``params``: what a caller may send, with each
param's type, bounds, choices, default and a description, and the rules between params.

``GET /v1/operations`` (and gRPC ``ListOperations``) serves them, one per operation, and the
OpenAPI document embeds them, so that clients can check and document their params before they
send a request. They describe; they do not decide: the operations' validators
(:func:`hypermedia.engines.imaging.ops.validate_params`,
:func:`hypermedia.engines.documents.params.validate_params`,
:func:`hypermedia.engines.media.params.validate_params`,
:func:`hypermedia.engines.ocr.params.validate_params`, and the gateway's "``noop`` takes no
params") check every request and normalise its params. A schema accepts exactly what its
validator accepts, except for the rules JSON Schema cannot state, which its ``description``
lists after "Also checked:" (a pixel product, the OCR languages the running workers reported, …):
there the schema accepts params the validator refuses, never the reverse. An explicit ``null``
param is absent (the default), as the validators read it; params left out are ``{}``.

``tests/unit/test_params_schemas.py`` holds each schema to its validator on valid and invalid
examples (bounds, every choice, every default, each rule broken).

Importing this package loads no native library (no libvips, PyAV, PDFium or tesseract): the
limits of the image operations, whose validator module imports pyvips, are copies
(:mod:`hypermedia.engines.schemas.imaging`); the others are the validators' own constants.
"""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.schemas import documents, imaging, media, ocr
from hypermedia.engines.schemas.common import DIALECT, operation

__all__ = ["DIALECT", "NOOP", "PARAMS_SCHEMAS"]

NOOP: Final = "noop"
"""``hypermedia.jobs.noop.OPERATION`` (the engines may not import ``hypermedia.jobs``; the test
compares them)."""

PARAMS_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    **imaging.SCHEMAS,
    **documents.SCHEMAS,
    **ocr.SCHEMAS,
    **media.SCHEMAS,
    NOOP: operation(
        NOOP,
        "A job that does nothing, for benchmarks and tests of the job system; offered only where "
        "HM_NOOP_OPERATION=1 is set. Takes no params: {}.",
    ),
}
"""Operation name → JSON Schema (draft 2020-12) of its ``params`` object."""
