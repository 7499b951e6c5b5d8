"""The docworker's LibreOffice listener settings (:mod:`hypermedia.engines.documents.office`)."""

from __future__ import annotations

from pydantic import Field, field_validator

from hypermedia.core.config import ComponentSettings


class OfficeSettings(ComponentSettings):
    """The docworker's LibreOffice listeners (see :mod:`hypermedia.engines.documents.office`)."""

    python: str = Field("/usr/bin/python3", validation_alias="HM_OFFICE_PYTHON")
    """A Python with LibreOffice's ``uno`` module (Debian: ``python3-uno``) that runs the
    conversion host."""
    soffice: str = Field("/usr/lib/libreoffice/program/soffice", validation_alias="HM_OFFICE_SOFFICE")
    max_conversions: int = Field(200, ge=1, validation_alias="HM_OFFICE_MAX_CONVERSIONS")
    """Conversions before a listener is restarted (bounds what one document can leave behind)."""
    start_timeout: float = Field(60.0, gt=0, validation_alias="HM_OFFICE_START_TIMEOUT")
    """Seconds a listener may take to start (LibreOffice: about 2 s)."""
    memory_mb: int = Field(4096, ge=512, validation_alias="HM_OFFICE_MEMORY_MB")
    """``RLIMIT_AS`` of a listener, MiB (LibreOffice maps about 1.3 GiB of address space at start)."""
    nproc: int = Field(64, ge=16, validation_alias="HM_OFFICE_NPROC")
    """``RLIMIT_NPROC`` of a listener's uid (soffice runs about 10 threads)."""
    fsize_mb: int = Field(2048, ge=1, validation_alias="HM_OFFICE_FSIZE_MB")
    """``RLIMIT_FSIZE`` of a listener: the largest file it may write, MiB."""
    require_landlock: bool = Field(False, validation_alias="HM_OFFICE_REQUIRE_LANDLOCK")
    """Refuse to start a listener on a kernel without Landlock (its conversions then fail
    ``OFFICE_UNAVAILABLE``) instead of starting it, with a warning, without the filesystem view
    (:func:`hypermedia.engines.documents.office.listener_view`)."""
    read_paths: str = Field("", validation_alias="HM_OFFICE_READ_PATHS")
    """More paths (``:``-separated, absolute) a listener may read besides
    :func:`hypermedia.engines.documents.office.listener_view`'s, e.g. a font directory outside ``/usr``."""

    @field_validator("read_paths")
    @classmethod
    def _absolute_read_paths(cls, value: str) -> str:
        for path in filter(None, value.split(":")):
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not an absolute path")
        return value
