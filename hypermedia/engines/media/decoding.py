"""Decoding past damaged packets, for every media operation that decodes a whole stream
(``transcode_video``, ``transcode_audio``, ``waveform``; issue 15, item 9).

FFmpeg's command line and players go on past a packet the decoder rejects (an MP3 frame whose
bits are damaged: "big_values too big", "invalid block type"): the packet's samples or picture
are missing from the output, the rest is there. :class:`DecodeErrors` does the same and counts
the packets skipped (the operations' ``decode_errors``), and applies the command line's bound on
them: when more than :data:`MAX_ERROR_RATE` of a stream's decoding attempts fail, the file is
damaged, not merely blemished (``CORRUPT_INPUT``), as ``ffmpeg`` exits with its "Decode error
rate exceeds maximum" (exit code 69) past its ``-max_error_rate``.

A demuxer that cannot go on (a file cut off or damaged inside a packet's framing) ends the input
there: what decoded before is kept and the failure counts as one error; before any frame decoded,
it is ``CORRUPT_INPUT``.

Runs FFmpeg on untrusted input: use it in the sandbox child only. Importing this module is
fork-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import av
import av.error
from av.container import InputContainer

from hypermedia.core.errors import PermanentJobError

__all__ = ["MAX_ERROR_RATE", "DecodeErrors"]

MAX_ERROR_RATE: Final = 2 / 3
"""Largest fraction of a stream's decoding attempts that may fail, ``errors / (errors + frames
decoded)``: the default of ``ffmpeg``'s ``-max_error_rate`` (``fftools/ffmpeg_opt.c``; the
command line checks it per decoder when the stream ends, ``fftools/ffmpeg_dec.c``). An MP3 of
116 frames with 104 of them overwritten decoded 12 frames and failed 96 (rate 0.89): ``ffmpeg``
exits 69; one damaged frame, or every third, passes."""


class DecodeErrors:
    """The decoded frames of some streams of one open container, damaged packets skipped and
    counted per stream (module doc). One instance per pass over the file."""

    def __init__(self, counted: Callable[[Any], bool] | None = None) -> None:
        self.counted = counted
        """Which packets that do not decode are counted (every one: ``None``). A chunk of a
        transcode decodes a few packets of the next chunk to finish its own frames, and counts
        only the errors of its own (:class:`hypermedia.engines.media.passes.Transcode`)."""
        self.errors: dict[int, int] = {}
        """Packets that did not decode, per stream index."""
        self.frames: dict[int, int] = {}
        """Frames decoded, per stream index."""
        self.ended_early = False
        """The input ended before the end of the file: the demuxer gave up (or the caller could
        not go on with a frame); counted as one error."""
        self._kinds: dict[int, str] = {}

    @property
    def count(self) -> int:
        """Packets skipped over all streams, and 1 when the input ended early: ``decode_errors``."""
        return sum(self.errors.values()) + int(self.ended_early)

    def decode(self, container: InputContainer, streams: Sequence[Any]) -> Iterator[Any]:
        """Demuxes ``streams`` of ``container`` and yields their decoded frames in demuxing order,
        the decoders flushed at the end. Call :meth:`check` after the last frame.

        Raises:
            PermanentJobError: ``CORRUPT_INPUT`` when the demuxer fails before any frame decoded.
            MemoryError: FFmpeg could not allocate.
        """
        self._kinds.update((stream.index, stream.type) for stream in streams)
        packets = container.demux(list(streams))
        while True:
            try:
                packet = next(packets, None)
            except MemoryError:  # av.error.MemoryError is one, and an FFmpegError
                raise
            except av.error.FFmpegError as exc:
                if not any(self.frames.values()):
                    raise PermanentJobError(
                        "The media file is damaged: its packets cannot be read.", "CORRUPT_INPUT"
                    ) from exc
                self.ended_early = True  # a damaged tail: what decoded stands
                for stream in streams:
                    yield from self._decode(stream, None)
                return
            if packet is None:
                return
            # A packet of size 0 ends its stream: None flushes the decoder.
            yield from self._decode(packet.stream, None if packet.size == 0 else packet)

    def _decode(self, stream: Any, packet: Any) -> list[Any]:
        index = stream.index
        try:
            frames = stream.codec_context.decode(packet)
        except MemoryError:  # av.error.MemoryError is one, and an FFmpegError
            raise
        except av.error.FFmpegError:
            if self.counted is None or packet is None or self.counted(packet):
                self.errors[index] = self.errors.get(index, 0) + 1
            return []
        self.frames[index] = self.frames.get(index, 0) + len(frames)
        return frames

    def check(self) -> None:
        """Raises PermanentJobError ``CORRUPT_INPUT`` when more than :data:`MAX_ERROR_RATE` of a
        stream's decoding attempts failed (every attempt, when it decoded no frame at all)."""
        for index, errors in sorted(self.errors.items()):
            frames = self.frames.get(index, 0)
            if errors / (errors + frames) > MAX_ERROR_RATE:
                raise PermanentJobError(
                    f"The {self._kinds.get(index, 'media')} stream {index} is damaged: {errors} of "
                    f"its packets do not decode, against "
                    f"{frames} decoded frames (more than {MAX_ERROR_RATE:.3g} of the attempts failed).",
                    "CORRUPT_INPUT",
                )
