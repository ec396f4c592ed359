"""Image inputs for chat requests: sizes, limits, and a PNG whose pixels differ per request at no
encoding cost.

vLLM's multimodal cache keys an image by its decoded pixels, so a pool of a few images sent again
and again would skip the vision encoder after the first time: the load would not be what users
send. A ``StampedPng`` is built once per pool entry as an uncompressed ("stored" deflate) PNG whose
last row holds an 8-byte stamp. Everything before that row is encoded once, base64 included, at a
length that is a multiple of 3 bytes, so a request's data URL is that text followed by the base64
of a small tail: the stamped row, the zlib stream's Adler-32 continued from the prefix's, one PNG
chunk CRC. No pixel is encoded per request. Stdlib only (the core wing); Pillow, in the plugin,
makes the pool's pixels and JPEGs, which cannot be stamped this way and repeat per pool entry.
"""

from __future__ import annotations

import base64
import struct
import zlib

MAX_SIDE = 4096  # pixels: a side beyond this is refused before any load
MAX_IMAGE_BYTES = 20 << 20  # a local image file larger than this is refused before any load
STAMP_BYTES = 8
FORMATS = ("png", "jpeg")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_STORED_MAX = 65535


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"512x512,1024x768"`` -> ``[(512, 512), (1024, 768)]``; ``ValueError`` in one line otherwise."""
    sizes = []
    for part in str(text or "").replace(" ", "").split(","):
        if not part:
            continue
        w, sep, h = part.lower().partition("x")
        if not sep or not w.isdigit() or not h.isdigit():
            raise ValueError(f"--image-size {part!r}: give WIDTHxHEIGHT in pixels, e.g. 512x512")
        width, height = int(w), int(h)
        if not (8 <= width <= MAX_SIDE and 8 <= height <= MAX_SIDE):
            raise ValueError(f"--image-size {part}: each side from 8 to {MAX_SIDE} pixels")
        sizes.append((width, height))
    if not sizes:
        raise ValueError("--image-size: give at least one WIDTHxHEIGHT")
    return sizes


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _stored_blocks(data: bytes, final: bool) -> bytes:
    """``data`` as deflate stored blocks (the last one final when ``final``)."""
    out = bytearray()
    pieces = [data[i:i + _STORED_MAX] for i in range(0, len(data), _STORED_MAX)] or [b""]
    for i, piece in enumerate(pieces):
        last = final and i == len(pieces) - 1
        out += bytes([1 if last else 0]) + struct.pack("<HH", len(piece), len(piece) ^ 0xFFFF) + piece
    return bytes(out)


class StampedPng:
    """An RGB PNG of ``width`` x ``height`` from ``pixels`` (``width * height * 3`` bytes) whose data
    URL carries a stamp in its last row's first pixels."""

    def __init__(self, width: int, height: int, pixels: bytes):
        if len(pixels) != width * height * 3:
            raise ValueError(f"{width}x{height} RGB needs {width * height * 3} bytes, not {len(pixels)}")
        row_bytes = 1 + width * 3  # the filter byte (0: none), then the row's pixels
        raw = b"".join(b"\x00" + pixels[r * width * 3:(r + 1) * width * 3] for r in range(height))
        head, self._last_row = raw[:-row_bytes], raw[-row_bytes:]
        self._head_adler = zlib.adler32(head)
        stream_head = b"\x78\x01" + (_stored_blocks(head, final=False) if head else b"")
        ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        fixed = len(PNG_SIGNATURE) + len(ihdr) + 12  # and the first IDAT's length, type and CRC
        # the first IDAT takes as much of the stream as keeps the prefix a multiple of 3 bytes long
        cut = len(stream_head) - ((fixed + len(stream_head)) % 3)
        prefix = PNG_SIGNATURE + ihdr + _chunk(b"IDAT", stream_head[:cut])
        assert len(prefix) % 3 == 0
        self._prefix_b64 = base64.b64encode(prefix).decode("ascii")
        self._carry = stream_head[cut:] + bytes([1]) + struct.pack("<HH", row_bytes, row_bytes ^ 0xFFFF)
        self._iend = _chunk(b"IEND", b"")
        self.width, self.height = width, height
        self.size_bytes = len(prefix) + len(self.tail(b"\x00" * STAMP_BYTES))

    def tail(self, stamp: bytes) -> bytes:
        row = self._last_row[:1] + stamp[:STAMP_BYTES].ljust(STAMP_BYTES, b"\x00") + self._last_row[1 + STAMP_BYTES:]
        adler = zlib.adler32(row, self._head_adler)
        return _chunk(b"IDAT", self._carry + row + struct.pack(">I", adler)) + self._iend

    def data_url(self, stamp: bytes = b"") -> str:
        """``data:image/png;base64,...`` with ``stamp`` (up to 8 bytes) in the last row."""
        return "data:image/png;base64," + self._prefix_b64 + base64.b64encode(self.tail(stamp)).decode("ascii")


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def image_parts(text: str, urls: list[str]) -> list[dict]:
    """A user message's content in the OpenAI format: its text, then each image as an ``image_url``."""
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": url}} for url in urls)]
