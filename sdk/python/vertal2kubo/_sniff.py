"""Content sniffing as Go's net/http.DetectContentType does it.

The MCP servers decide from a returned file's bytes, never its name, what
kind of content it becomes (image or resource, and the resource's MIME
type). The Go server uses http.DetectContentType (the WHATWG MIME Sniffing
algorithm on the first 512 bytes); this is the same table, so both servers
answer the same for the same file. The standard library's mimetypes only
guesses from names, which a program chooses freely.
"""

from __future__ import annotations

__all__ = ["detect_content_type"]

_SNIFF_LEN = 512
_WS = b"\t\n\x0c\r "
_TT = b" >"

_HTML = "text/html; charset=utf-8"
_HTML_TAGS = (b"<!DOCTYPE HTML", b"<HTML", b"<HEAD", b"<SCRIPT", b"<IFRAME", b"<H1", b"<DIV", b"<FONT",
              b"<TABLE", b"<A", b"<STYLE", b"<TITLE", b"<B", b"<BODY", b"<BR", b"<P", b"<!--")

# Each signature: ("exact", prefix, type) or ("masked", mask, pattern, skip_ws, type),
# in the order of the Go table (the first match wins).
_SIGNATURES = (
    ("masked", b"\xFF\xFF\xFF\xFF\xFF", b"<?xml", True, "text/xml; charset=utf-8"),
    ("exact", b"%PDF-", "application/pdf"),
    ("exact", b"%!PS-Adobe-", "application/postscript"),
    # UTF byte order marks.
    ("masked", b"\xFF\xFF\x00\x00", b"\xFE\xFF\x00\x00", False, "text/plain; charset=utf-16be"),
    ("masked", b"\xFF\xFF\x00\x00", b"\xFF\xFE\x00\x00", False, "text/plain; charset=utf-16le"),
    ("masked", b"\xFF\xFF\xFF\x00", b"\xEF\xBB\xBF\x00", False, "text/plain; charset=utf-8"),
    # Images.
    ("exact", b"\x00\x00\x01\x00", "image/x-icon"),
    ("exact", b"\x00\x00\x02\x00", "image/x-icon"),
    ("exact", b"BM", "image/bmp"),
    ("exact", b"GIF87a", "image/gif"),
    ("exact", b"GIF89a", "image/gif"),
    ("masked", b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF\xFF\xFF", b"RIFF\x00\x00\x00\x00WEBPVP", False, "image/webp"),
    ("exact", b"\x89PNG\x0D\x0A\x1A\x0A", "image/png"),
    ("exact", b"\xFF\xD8\xFF", "image/jpeg"),
    # Audio and video.
    ("masked", b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF", b"FORM\x00\x00\x00\x00AIFF", False, "audio/aiff"),
    ("masked", b"\xFF\xFF\xFF", b"ID3", False, "audio/mpeg"),
    ("masked", b"\xFF\xFF\xFF\xFF\xFF", b"OggS\x00", False, "application/ogg"),
    ("masked", b"\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF", b"MThd\x00\x00\x00\x06", False, "audio/midi"),
    ("masked", b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF", b"RIFF\x00\x00\x00\x00AVI ", False, "video/avi"),
    ("masked", b"\xFF\xFF\xFF\xFF\x00\x00\x00\x00\xFF\xFF\xFF\xFF", b"RIFF\x00\x00\x00\x00WAVE", False, "audio/wave"),
    ("mp4",),
    ("exact", b"\x1A\x45\xDF\xA3", "video/webm"),
    # Fonts.
    ("masked", b"\x00" * 34 + b"\xFF\xFF", b"\x00" * 34 + b"LP", False, "application/vnd.ms-fontobject"),
    ("exact", b"\x00\x01\x00\x00", "font/ttf"),
    ("exact", b"OTTO", "font/otf"),
    ("exact", b"ttcf", "font/collection"),
    ("exact", b"wOFF", "font/woff"),
    ("exact", b"wOF2", "font/woff2"),
    # Archives.
    ("exact", b"\x1F\x8B\x08", "application/x-gzip"),
    ("exact", b"PK\x03\x04", "application/zip"),
    ("exact", b"Rar!\x1A\x07\x00", "application/x-rar-compressed"),
    ("exact", b"Rar!\x1A\x07\x01\x00", "application/x-rar-compressed"),
    ("exact", b"\x00\x61\x73\x6D", "application/wasm"),
)

# Bytes that make data binary (WHATWG "binary data byte").
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])


def _html(data: bytes, tag: bytes) -> bool:
    if len(data) < len(tag) + 1:
        return False
    for want, got in zip(tag, data):
        if 0x41 <= want <= 0x5A:  # A-Z: compare case-insensitively
            got &= 0xDF
        if want != got:
            return False
    return data[len(tag)] in _TT


def _masked(data: bytes, mask: bytes, pattern: bytes) -> bool:
    return len(data) >= len(pattern) and all(d & m == p for d, m, p in zip(data, mask, pattern))


def _mp4(data: bytes) -> bool:
    if len(data) < 12:
        return False
    box = int.from_bytes(data[:4], "big")
    if len(data) < box or box % 4 != 0 or data[4:8] != b"ftyp":
        return False
    # Bytes 12-15 are the major brand's version number.
    return any(data[st:st + 3] == b"mp4" for st in range(8, box, 4) if st != 12)


def detect_content_type(data: bytes) -> str:
    """The MIME type of data; "application/octet-stream" when unknown."""
    data = bytes(data[:_SNIFF_LEN])
    first = 0
    while first < len(data) and data[first] in _WS:
        first += 1
    trimmed = data[first:]
    for tag in _HTML_TAGS:
        if _html(trimmed, tag):
            return _HTML
    for sig in _SIGNATURES:
        kind = sig[0]
        if kind == "exact" and data.startswith(sig[1]):
            return sig[2]
        if kind == "masked" and _masked(trimmed if sig[3] else data, sig[1], sig[2]):
            return sig[4]
        if kind == "mp4" and _mp4(data):
            return "video/mp4"
    if not any(b in _BINARY for b in trimmed):
        return "text/plain; charset=utf-8"
    return "application/octet-stream"
