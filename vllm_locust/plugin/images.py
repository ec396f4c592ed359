"""The image pool of a chat workload (``--images-per-request``): synthetic images made once with
Pillow from the workload's seed, and each request's ``image_url`` parts.

PNG entries are ``core.images.StampedPng``: with unique prompts on (the default), every request's
images carry that request's stamp, so vLLM's multimodal cache never serves them and the vision
encoder runs for each. JPEG entries are encoded once by Pillow and repeat every pool's length
(said once at build). Sizes are drawn with the seed among ``--image-size``'s.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
from dataclasses import dataclass

from ..core.images import FORMATS, MAX_IMAGE_BYTES, StampedPng, data_url, image_parts, parse_sizes

logger = logging.getLogger(__name__)
POOL = 16  # images made per pool; a request takes the next ``--images-per-request`` of them


@dataclass(frozen=True)
class PoolImage:
    png: StampedPng | None
    url: str  # JPEG's fixed data URL ("" for a PNG: made per request)
    size_bytes: int


class ImagePool:
    def __init__(self, per_request: int, sizes: list[tuple[int, int]], fmt: str, seed: int, unique: bool):
        if fmt not in FORMATS:
            raise ValueError(f"--image-format {fmt!r}: one of {', '.join(FORMATS)}")
        from PIL import Image

        rng = random.Random(f"images:{seed}")
        self.per_request, self.unique, self.format = per_request, unique and fmt == "png", fmt
        self.images: list[PoolImage] = []
        for _ in range(max(POOL, per_request)):
            width, height = rng.choice(sizes)
            pixels = rng.randbytes(width * height * 3)
            if fmt == "png":
                png = StampedPng(width, height, pixels)
                self.images.append(PoolImage(png, "", png.size_bytes))
            else:
                out = io.BytesIO()
                Image.frombytes("RGB", (width, height), pixels).save(out, "JPEG", quality=90)
                data = out.getvalue()
                self.images.append(PoolImage(None, data_url("image/jpeg", data), len(data)))
        self._next = 0
        if unique and fmt == "jpeg":
            logger.warning("--image-format jpeg: the pool's %d images repeat across requests (only PNG is stamped per "
                           "request), so vLLM's multimodal cache may skip the encoder for repeats", len(self.images))

    def for_request(self, tag: str) -> tuple[list[str], int]:
        """This request's image data URLs and their encoded bytes (stamped with ``tag`` when unique)."""
        stamp = hashlib.blake2b(tag.encode(), digest_size=8).digest() if self.unique else b""
        urls, total = [], 0
        for _ in range(self.per_request):
            image = self.images[self._next % len(self.images)]
            self._next += 1
            urls.append(image.png.data_url(stamp) if image.png is not None else image.url)
            total += image.size_bytes
        return urls, total


def pool_of(options) -> ImagePool | None:
    """The pool the options ask for; None without ``--images-per-request``; ``ValueError`` in one
    line for a bad size or format (before any load: the workload's build)."""
    try:
        per_request = int(getattr(options, "images_per_request", 0) or 0)  # the web form's is a string
    except ValueError:
        raise ValueError(f"--images-per-request {options.images_per_request!r}: a whole number") from None
    if per_request <= 0:
        return None
    if per_request > 64:
        raise ValueError(f"--images-per-request {per_request}: at most 64")
    from .options import as_bool  # the web form sends flags as text
    if getattr(options, "endpoint", "chat") != "chat":
        raise ValueError(f"--images-per-request needs --endpoint chat (images go in chat messages), not "
                         f"{options.endpoint}")
    return ImagePool(per_request, parse_sizes(getattr(options, "image_size", "512x512")),
                     str(getattr(options, "image_format", "png") or "png"), int(getattr(options, "seed", 0) or 0),
                     not as_bool(getattr(options, "no_unique_prompts", False)))


def with_images(messages, urls: list[str]) -> list:
    """``messages`` with ``urls`` as image parts of the last user message."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message.get("role") == "user":
            content = message.get("content")
            text = content if isinstance(content, str) else ""
            message["content"] = image_parts(text, urls)
            break
    return out


MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}


def dataset_images(prompts) -> dict[str, tuple[str, int | None]]:
    """Every image the pool's rows name -> (what the request sends, its bytes): a local file read
    once, checked by Pillow and sent as a data URL; an http(s) or data URL as it is (its bytes
    unknown to the client). ``ValueError`` in one line for a file that is no image, before any load."""
    from PIL import Image, UnidentifiedImageError

    out: dict[str, tuple[str, int | None]] = {}
    for prompt in prompts:
        for name in getattr(prompt, "images", ()):
            if name in out:
                continue
            if name.startswith(("http://", "https://", "data:")):
                out[name] = (name, None)
                continue
            try:
                with open(name, "rb") as f:
                    data = f.read(MAX_IMAGE_BYTES + 1)
            except OSError as err:
                raise ValueError(f"dataset image {name}: {err.strerror or err}") from None
            if len(data) > MAX_IMAGE_BYTES:
                raise ValueError(f"dataset image {name}: over the {MAX_IMAGE_BYTES:,}-byte limit on an image")
            try:
                with Image.open(io.BytesIO(data)) as image:
                    fmt = image.format
                    image.verify()
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
                raise ValueError(f"dataset image {name}: not an image Pillow can read ({type(err).__name__})") from None
            media = MEDIA_TYPES.get(str(fmt))
            if media is None:
                raise ValueError(f"dataset image {name}: {fmt} images are not sent (PNG, JPEG, WebP, GIF or BMP)")
            out[name] = (data_url(media, data), len(data))
    return out
