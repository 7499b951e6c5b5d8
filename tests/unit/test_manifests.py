"""The text rules of resolved outputs (hypermedia.core.manifests): which lines of an HLS playlist
or a WebVTT thumbnail track are references to sibling outputs, what replaces them, what is left
alone; and the signature of resolved-output URLs (services.gateway.resolved.LinkSigner)."""

from __future__ import annotations

import hashlib
import hmac

from hypermedia.core import manifests
from hypermedia.core.manifests import ManifestKind
from services.gateway.resolved import SIGNATURE_LABEL, LinkSigner

URLS = {
    "hls_720p": "https://gw/v1/jobs/j/outputs/hls_720p/resolved?expires=9&sig=ab",
    "hls_720p_media": "https://s3/derived/k?X-Amz-Signature=cd",
    "hls_audio": "https://gw/v1/jobs/j/outputs/hls_audio/resolved?expires=9&sig=ef",
    "sprite": "http://127.0.0.1:1/o/derived/sprite-1?expires=9&sig=01&ct=image%2Fjpeg",
}


def test_kind_of_reads_the_media_type_without_its_parameters() -> None:
    assert manifests.kind_of("application/vnd.apple.mpegurl") is ManifestKind.HLS
    assert manifests.kind_of("Application/X-MpegURL") is ManifestKind.HLS
    assert manifests.kind_of("text/vtt; charset=utf-8") is ManifestKind.VTT
    assert manifests.kind_of("video/mp4") is None
    assert manifests.kind_of("text/plain") is None


def test_master_playlist_variants_and_alternative_renditions() -> None:
    master = (
        "#EXTM3U\n"
        "#EXT-X-INDEPENDENT-SEGMENTS\n"
        '#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="aac",NAME="en",DEFAULT=YES,URI="hls_audio"\n'
        '#EXT-X-STREAM-INF:BANDWIDTH=1500000,RESOLUTION=1280x720,CODECS="avc1.64001f,mp4a.40.2",AUDIO="aac"\n'
        "hls_720p\n"
        "#EXT-X-STREAM-INF:BANDWIDTH=600000\n"
        "hls_360p\n"  # not an output of the job: stays
        "# hls_720p is the default\n"  # a comment: stays
    )
    out = manifests.rewrite_hls(master, URLS.get)
    lines = out.split("\n")
    assert lines[2].endswith(f'URI="{URLS["hls_audio"]}"') and 'GROUP-ID="aac"' in lines[2]
    assert (
        lines[3].startswith("#EXT-X-STREAM-INF:BANDWIDTH=1500000")
        and 'CODECS="avc1.64001f,mp4a.40.2"' in lines[3]
    )
    assert lines[4] == URLS["hls_720p"]
    assert lines[6] == "hls_360p"
    assert lines[7] == "# hls_720p is the default"
    assert manifests.references(ManifestKind.HLS, master) == {"hls_audio", "hls_720p", "hls_360p"}


def test_media_playlist_keeps_byte_ranges_and_line_endings() -> None:
    media = (
        "#EXTM3U\r\n"
        "#EXT-X-TARGETDURATION:4\r\n"
        '#EXT-X-MAP:URI="hls_720p_media",BYTERANGE="812@0"\r\n'
        "#EXTINF:4.000,\r\n"
        "#EXT-X-BYTERANGE:51200@812\r\n"
        "hls_720p_media\r\n"
        "#EXTINF:1.5,\r\n"
        "#EXT-X-BYTERANGE:20000\r\n"
        "hls_720p_media\r\n"
        "#EXT-X-ENDLIST"  # no terminator at the end
    )
    out = manifests.rewrite_hls(media, URLS.get)
    expected = (
        media.replace('URI="hls_720p_media"', f'URI="{URLS["hls_720p_media"]}"')
        .replace("\r\nhls_720p_media\r\n", f"\r\n{URLS['hls_720p_media']}\r\n")
        .replace("\r\nhls_720p_media\r\n", f"\r\n{URLS['hls_720p_media']}\r\n")
    )
    assert out == expected
    assert out.count(URLS["hls_720p_media"]) == 3 and 'BYTERANGE="812@0"' in out
    assert manifests.presentation_seconds(ManifestKind.HLS, media) == 6  # 5.5 rounded up


def test_only_exact_names_are_references() -> None:
    playlist = (
        "#EXTM3U\n./hls_720p_media\nhttps://cdn/hls_720p_media\nHLS_720P_MEDIA\n#EXT-X-KEY:METHOD=NONE\n"
    )
    assert manifests.rewrite_hls(playlist, URLS.get) == playlist


def test_vtt_cue_payloads_keep_their_fragment() -> None:
    vtt = (
        "\ufeffWEBVTT\n"
        "\n"
        "NOTE sprite#xywh=0,0,160,90 is the first tile\n"
        "\n"
        "00:00:00.000 --> 00:00:05.000\n"
        "sprite#xywh=0,0,160,90\n"
        "\n"
        "cue-2\n"
        "00:00:05.000 --> 00:00:10.000\n"
        "sprite#xywh=160,0,160,90\n"
        "\n"
        "00:00:10.000 --> 01:00:10.250\n"
        "other.jpg#xywh=0,0,160,90\n"
        "sprite\n"
    )
    out = manifests.rewrite_vtt(vtt, URLS.get).split("\n")
    assert out[0] == "\ufeffWEBVTT"
    assert out[2] == "NOTE sprite#xywh=0,0,160,90 is the first tile"
    assert out[5] == f"{URLS['sprite']}#xywh=0,0,160,90"
    assert out[7] == "cue-2"
    assert out[9] == f"{URLS['sprite']}#xywh=160,0,160,90"
    assert out[12] == "other.jpg#xywh=0,0,160,90"
    assert out[13] == URLS["sprite"]
    assert manifests.references(ManifestKind.VTT, vtt) == {"sprite", "other.jpg"}  # candidates
    assert manifests.presentation_seconds(ManifestKind.VTT, vtt) == 3611


def test_a_cue_identifier_that_looks_like_a_name_is_not_rewritten() -> None:
    vtt = "WEBVTT\n\nsprite\n00:00:00.000 --> 00:00:01.000\nsprite#xywh=0,0,1,1\n"
    assert manifests.rewrite_vtt(vtt, URLS.get).split("\n")[2] == "sprite"


def test_link_signer_binds_job_output_and_expiry() -> None:
    secret = "gateway-secret-0123456789abcdef"
    signer = LinkSigner.from_secret(secret)
    job = "5c2e0a53-3bd4-4f0e-9d51-8b1f3b9f4a10"
    sig = signer.sign(job, "hls_720p", 2_000_000_000)
    key = hmac.new(secret.encode(), SIGNATURE_LABEL, hashlib.sha256).digest()
    expected = hmac.new(key, f"{job}\nhls_720p\n2000000000".encode(), hashlib.sha256).hexdigest()
    assert sig == expected
    assert signer.valid(job, "hls_720p", "2000000000", sig, now=1_999_999_999)
    assert not signer.valid(job, "hls_720p", "2000000000", sig, now=2_000_000_001)  # expired
    assert not signer.valid(job, "hls_360p", "2000000000", sig, now=0)  # another output
    assert not signer.valid(job, "hls_720p", "2000000001", sig, now=0)  # another expiry
    assert not signer.valid(job, "hls_720p", "+2000000000", sig, now=0)
    assert not signer.valid(job, "hls_720p", "2000000000", sig.upper(), now=0)


def test_absurd_numbers_in_a_text_do_not_fail_the_request() -> None:
    """A cue hour of thousands of digits (Python refuses to parse > 4300 digits) or an EXTINF
    of as many: not a timing, so ignored, never a 500."""
    huge = "9" * 5000
    vtt = f"WEBVTT\n\n{huge}:00:00.000 --> {huge}:00:01.000\nsprite#xywh=0,0,1,1\n"
    assert manifests.presentation_seconds(ManifestKind.VTT, vtt) <= manifests.MAX_PRESENTATION_SECONDS
    playlist = f"#EXTM3U\n#EXTINF:{huge},\nhls_720p_media\n"
    assert manifests.presentation_seconds(ManifestKind.HLS, playlist) <= manifests.MAX_PRESENTATION_SECONDS
