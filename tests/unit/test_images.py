"""``core.images``: sizes, and the stamped PNG that Pillow (as vLLM) decodes to the pool's pixels with
each request's stamp in its last row; ``plugin.images``: the pool and the message parts."""

from __future__ import annotations

import base64
import io
import random

import pytest
from PIL import Image

from vllm_locust.core.images import StampedPng, parse_sizes
from vllm_locust.plugin.images import ImagePool, with_images


@pytest.mark.parametrize("width,height", [(8, 8), (64, 48), (333, 777), (700, 100)])  # 700x100: a head over one stored block
def test_a_stamped_png_decodes_to_its_pixels_with_the_stamp_in_its_last_row(width, height):
    pixels = random.Random(width).randbytes(width * height * 3)
    png = StampedPng(width, height, pixels)
    urls = {}
    for stamp in (b"ABCDEFGH", b"12345678", b""):
        url = png.data_url(stamp)
        raw = base64.b64decode(url.removeprefix("data:image/png;base64,"), validate=True)
        assert len(raw) == png.size_bytes
        image = Image.open(io.BytesIO(raw))
        image.load()  # checks every chunk's CRC and the zlib stream's Adler-32
        assert image.size == (width, height) and image.mode == "RGB"
        expected = bytearray(pixels)
        start = (height - 1) * width * 3
        expected[start:start + 8] = stamp.ljust(8, b"\x00")
        assert image.tobytes() == bytes(expected)
        urls[stamp] = url
    assert len(set(urls.values())) == 3


def test_sizes_parse_or_say_what_is_wrong_in_one_line():
    assert parse_sizes("512x512, 1024X768") == [(512, 512), (1024, 768)]
    for bad, said in (("512", "WIDTHxHEIGHT"), ("4x4", "from 8"), ("9000x10", "from 8"), ("", "at least one")):
        with pytest.raises(ValueError, match=said):
            parse_sizes(bad)


def test_the_pool_stamps_png_per_request_and_repeats_jpeg():
    pool = ImagePool(2, [(32, 32), (16, 24)], "png", seed=3, unique=True)
    again = ImagePool(2, [(32, 32), (16, 24)], "png", seed=3, unique=True)
    first, size = pool.for_request("run:0:1")
    assert len(first) == 2 and size == sum(i.size_bytes for i in pool.images[:2])
    assert again.for_request("run:0:1")[0] == first, "the same seed and request: the same images"
    assert not set(first) & set(pool.for_request("run:0:2")[0])
    jpeg = ImagePool(1, [(32, 32)], "jpeg", seed=3, unique=True)
    urls = [jpeg.for_request(f"r{i}")[0][0] for i in range(len(jpeg.images) + 1)]
    assert urls[0] == urls[-1] and urls[0].startswith("data:image/jpeg;base64,"), "a pool's length later"


def test_images_go_into_the_last_user_message_after_its_text():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "describe"}]
    out = with_images(messages, ["data:image/png;base64,AAAA"])
    assert out[0] == messages[0] and messages[1]["content"] == "describe", "the rendered prompt is left as it was"
    assert out[1]["content"] == [{"type": "text", "text": "describe"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]


def test_the_pool_reads_the_web_forms_text_as_the_command_line_does():
    from types import SimpleNamespace

    from vllm_locust.plugin.images import pool_of

    form = SimpleNamespace(images_per_request="2", image_size="16x16", image_format="png", seed="0",
                           no_unique_prompts="false", endpoint="chat")
    pool = pool_of(form)
    assert pool.per_request == 2 and pool.unique, "the text 'false' is not a set flag"
    assert not pool_of(SimpleNamespace(**{**vars(form), "no_unique_prompts": "true"})).unique
    assert pool_of(SimpleNamespace(**{**vars(form), "images_per_request": ""})) is None
    with pytest.raises(ValueError, match="needs --endpoint chat"):
        pool_of(SimpleNamespace(**{**vars(form), "endpoint": "completions"}))
    with pytest.raises(ValueError, match="a whole number"):
        pool_of(SimpleNamespace(**{**vars(form), "images_per_request": "two"}))
