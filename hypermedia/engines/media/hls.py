"""HLS packaging of ``transcode_video`` (:mod:`hypermedia.engines.media.transcode`, step 5 of its
module doc): each finished H.264 rendition remuxed (no second encode) by FFmpeg's ``hls`` muxer
into one single-file fragmented MP4 and a VOD media playlist of byte ranges, the playlists'
``BANDWIDTH`` and ``AVERAGE-BANDWIDTH`` measured from those byte ranges, the RFC 6381 ``CODECS``
attribute read from the H.264 parameter sets, and the master playlist (RFC 8216 §4.3.4.2).

Runs FFmpeg's muxer on files the transcode wrote: call it in the sandbox child only.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Final

import av

from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media.encoding import Encoded

__all__ = ["HLS_MIME", "package_hls"]


HLS_MIME: Final = "application/vnd.apple.mpegurl"


# --- HLS -----------------------------------------------------------------------------------------

_EXTINF: Final = re.compile(r"#EXTINF:([0-9.]+)")
_BYTERANGE: Final = re.compile(r"#EXT-X-BYTERANGE:(\d+)@(\d+)")


def package_hls(
    encoded: list[Encoded], out_dir: Path, frame_rate: Fraction | None, segment_seconds: int
) -> list[OutputFile]:
    """Remuxes every finished rendition (``encoded``, highest first) into single-file fragmented
    MP4 HLS in ``out_dir`` and writes the master playlist, whose ``FRAME-RATE`` is the source's
    ``frame_rate`` (module doc, step 5)."""
    outputs: list[OutputFile] = []
    variants = []
    for output in encoded:
        name = f"hls_{output.rendition.name}"
        media_name = f"{name}_media"
        playlist_path = out_dir / f"{name}.m3u8"
        media_path = out_dir / f"{media_name}.mp4"
        _remux_hls(output.path, playlist_path, media_path, segment_seconds)
        text = playlist_path.read_text()
        text = text.replace(f'URI="{media_path.name}"', f'URI="{media_name}"')
        text = re.sub(rf"^{re.escape(media_path.name)}$", media_name, text, flags=re.MULTILINE)
        playlist_path.write_text(text)
        bandwidth, average, segments = _bandwidth(text)
        codecs = _codecs_attribute(output)
        variants.append((name, output, bandwidth, average, codecs))
        outputs.append(
            OutputFile(
                media_name,
                media_path.name,
                "video/mp4",
                {
                    "size_bytes": media_path.stat().st_size,
                    "width": output.rendition.width,
                    "height": output.rendition.height,
                },
            )
        )
        outputs.append(
            OutputFile(
                name,
                playlist_path.name,
                HLS_MIME,
                {
                    "segments": segments,
                    "bandwidth": bandwidth,
                    "average_bandwidth": average,
                    "size_bytes": len(text.encode()),
                },
            )
        )
    rate = frame_rate
    lines = ["#EXTM3U", "#EXT-X-VERSION:7", "#EXT-X-INDEPENDENT-SEGMENTS"]
    for name, output, bandwidth, average, codecs in variants:
        attributes = [
            f"BANDWIDTH={bandwidth}",
            f"AVERAGE-BANDWIDTH={average}",
            f"RESOLUTION={output.rendition.width}x{output.rendition.height}",
            f'CODECS="{codecs}"',
        ]
        if rate:
            attributes.append(f"FRAME-RATE={float(rate):.3f}")
        lines += ["#EXT-X-STREAM-INF:" + ",".join(attributes), name]
    master = "\n".join(lines) + "\n"
    (out_dir / "hls_master.m3u8").write_text(master)
    outputs.append(
        OutputFile(
            "hls_master",
            "hls_master.m3u8",
            HLS_MIME,
            {"renditions": [name for name, *_ in variants], "size_bytes": len(master.encode())},
        )
    )
    return outputs


def _remux_hls(source: Path, playlist: Path, media: Path, segment_seconds: int) -> None:
    with av.open(str(source)) as inp:
        out = av.open(
            str(playlist),
            mode="w",
            format="hls",
            options={
                "hls_time": str(segment_seconds),
                "hls_segment_type": "fmp4",
                "hls_flags": "single_file+independent_segments",
                "hls_playlist_type": "vod",
                "hls_segment_filename": str(media),
            },
        )
        try:
            streams = {stream.index: out.add_stream_from_template(stream) for stream in inp.streams}
            for packet in inp.demux():
                if packet.dts is None:
                    continue
                packet.stream = streams[packet.stream.index]
                out.mux(packet)
        finally:
            out.close()


def _bandwidth(playlist: str) -> tuple[int, int, int]:
    """``(peak, average, segments)`` of a byte-range media playlist: bits/s of the largest
    segment over its duration, of all segments over the total, and the number of segments."""
    peak = 0.0
    total_bytes = 0
    total_seconds = 0.0
    segments = 0
    seconds: float | None = None
    for line in playlist.splitlines():
        if (match := _EXTINF.match(line)) is not None:
            seconds = float(match.group(1))
        elif (match := _BYTERANGE.match(line)) is not None and seconds is not None:
            length = int(match.group(1))
            segments += 1
            total_bytes += length
            total_seconds += seconds
            if seconds > 0:
                peak = max(peak, length * 8 / seconds)
            seconds = None
    average = total_bytes * 8 / total_seconds if total_seconds else 0.0
    return math.ceil(peak), math.ceil(average), segments


def _codecs_attribute(output: Encoded) -> str:
    """RFC 6381 codec strings: ``avc1.PPCCLL`` from the H.264 SPS (profile_idc, constraint flags,
    level_idc) and ``mp4a.40.2`` for AAC-LC."""
    extradata = output.extradata
    video = "avc1.640028"
    for start in (m.end() for m in re.finditer(b"\x00\x00\x01", extradata)):
        if start + 3 < len(extradata) and extradata[start] & 0x1F == 7:  # SPS
            video = "avc1." + extradata[start + 1 : start + 4].hex()
            break
    else:
        if len(extradata) >= 4 and extradata[0] == 1:  # avcC: version, profile, compat, level
            video = "avc1." + extradata[1:4].hex()
    return f"{video},mp4a.40.2" if output.has_audio else video
