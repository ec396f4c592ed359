"""Issue 44's image inputs against the recording mock, in one process and with ``--processes 2``:
every request carries its ``--images-per-request`` synthetic images as ``image_url`` parts, each
request's PNGs differ from every other request's (vLLM's multimodal cache keys on pixels), the rows
record how many images and bytes went, the mock charges prefill per image, and a bad size stops
the run before any load with one line."""

from __future__ import annotations

import pytest

from tests.conftest import headless, processes, request_rows, start_fake_server

LOAD = ["--max-tokens", "4", "--prompt-tokens", "16", "--prompt-pool", "4"]


def stored_png_bytes(width: int, height: int) -> int:
    """An uncompressed RGB PNG's size: signature, IHDR, two IDAT chunks (zlib header, one stored block
    of the rows before the last, one of the last row, Adler-32) and IEND."""
    row = 1 + 3 * width
    return 8 + 25 + 2 * 12 + 2 + (5 + (height - 1) * row) + (5 + row) + 4 + 12


@pytest.fixture(scope="module")
def server():
    mock = start_fake_server()
    yield mock
    mock.stop()


@pytest.mark.parametrize("procs", [1, 2])
def test_each_request_sends_its_own_images_and_its_row_counts_them(server, tmp_path, procs):
    server.configure(ttft_ms=10, itl_ms=2, tokens=4, image_ms=40.0, log_bodies=True)
    proc = headless(server.url, tmp_path, *(processes(2) if procs == 2 else []), "-u", "2", "-r", "2", "-t", "3s",
                    "--images-per-request", "2", "--image-size", "64x48,32x32", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = server.log()
    assert len(sent) >= 4, proc.stderr[-3000:]
    assert all(len(r["images"]) == 2 for r in sent), "two image_url parts in every request"
    digests = [d for r in sent for d in r["images"]]
    assert len(set(digests)) == len(digests), "no image sent twice: the encoder runs for every one"
    for record in sent:
        (message,) = record["body"]["messages"]
        kinds = [part["type"] for part in message["content"]]
        assert kinds == ["text", "image_url", "image_url"], kinds
        assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in message["content"][1:])
    rows = request_rows(tmp_path)
    ok = rows[rows["kind"] == "ok"]
    assert len(ok) and (ok["images"] == 2).all()
    big, small = stored_png_bytes(64, 48), stored_png_bytes(32, 32)
    assert set(ok["image_bytes"]) <= {2 * big, big + small, 2 * small} and ok["image_bytes"].nunique() >= 2
    assert (ok["ttft_ms"] >= 10 + 2 * 40).all(), "the mock's prefill is charged per image"
    assert (ok["prompt_tokens"] > 2 * 64).all(), "and its usage counts the image tokens"
    if procs == 2:
        assert ok["worker_id"].nunique() == 2


def test_a_bad_image_size_stops_the_run_before_any_load(server, tmp_path):
    server.configure(ttft_ms=10, itl_ms=2, tokens=4, log_bodies=True)
    proc = headless(server.url, tmp_path, "-u", "1", "-r", "1", "-t", "3s", "--images-per-request", "1",
                    "--image-size", "64by48", *LOAD)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "--image-size '64by48'" in line]
    assert len(said) == 1 and "WIDTHxHEIGHT" in said[0], proc.stderr[-3000:]
    assert server.log() == [], "nothing was sent"
    assert "Traceback" not in proc.stderr


def png_file(path, size=(24, 16), color=(200, 30, 30)):
    from PIL import Image

    Image.new("RGB", size, color).save(path, "PNG")
    return path


def test_dataset_rows_send_their_own_images(server, tmp_path):
    """Custom JSONL rows with ``images`` (paths relative to the file, or URLs) and ShareGPT entries
    with vLLM's ``image`` field: each request sends its row's images, local files as data URLs."""
    import base64
    import hashlib
    import json

    png_file(tmp_path / "red.png")
    (tmp_path / "pics").mkdir()
    png_file(tmp_path / "pics" / "blue.png", (8, 8), (0, 0, 255))
    remote = "https://images.example/cat.png"  # the server fetches a URL; the mock only counts it
    custom = tmp_path / "rows.jsonl"
    custom.write_text("\n".join(json.dumps(row) for row in (
        {"prompt": "describe both " + "w " * 8, "output_tokens": 4, "images": ["red.png", "pics/blue.png"]},
        {"prompt": "describe the url " + "w " * 8, "output_tokens": 4, "images": [remote]},
        {"prompt": "no image here " + "w " * 8, "output_tokens": 4})) + "\n")
    server.configure(ttft_ms=5, itl_ms=1, tokens=4, log_bodies=True)
    out = tmp_path / "custom"
    proc = headless(server.url, out, "-u", "1", "-r", "1", "-t", "2s", "--workload", "custom", "--dataset-path",
                    str(custom), "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]

    def digest(url):
        return hashlib.sha1(url.encode()).hexdigest()

    def file_url(path):
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()

    expected = {"describe both": [digest(file_url(tmp_path / "red.png")), digest(file_url(tmp_path / "pics" / "blue.png"))],
                "describe the url": [digest(remote)], "no image here": []}
    seen = set()
    for record in server.log():
        content = record["body"]["messages"][-1]["content"]
        text = content if isinstance(content, str) else content[0]["text"]
        (key,) = [k for k in expected if k in text]
        assert record["images"] == expected[key], key
        seen.add(key)
    assert seen == set(expected), "every row was sent"
    rows = request_rows(out)
    ok = rows[rows["kind"] == "ok"]
    both = (tmp_path / "red.png").stat().st_size + (tmp_path / "pics" / "blue.png").stat().st_size
    assert set(zip(ok["images"].fillna(0).astype(int), ok["image_bytes"].fillna(0).astype(int))) == \
        {(2, both), (1, 0), (0, 0)}, "a URL's bytes are the server's to fetch: not counted"

    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([{"image": "red.png", "conversations": [
        {"from": "human", "value": "what is red " + "w " * 8}, {"from": "gpt", "value": "a colour of four"}]}]))
    server.configure(ttft_ms=5, itl_ms=1, tokens=4, log_bodies=True)
    proc = headless(server.url, tmp_path / "sg", "-u", "1", "-r", "1", "-t", "2s", "--workload", "sharegpt",
                    "--dataset-path", str(sharegpt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert server.log() and all(r["images"] == expected["describe both"][:1] for r in server.log())


@pytest.mark.parametrize("bad,said", [("missing.png", '"images" missing.png: no such file'),
                                      ("notes.png", "dataset image"), ])
def test_a_bad_dataset_image_stops_the_run_before_any_load(server, tmp_path, bad, said):
    import json

    (tmp_path / "notes.png").write_text("this is text, not a picture\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "look " + "w " * 8, "output_tokens": 4, "images": [bad]}) + "\n")
    server.configure(ttft_ms=5, itl_ms=1, tokens=4, log_bodies=True)
    proc = headless(server.url, tmp_path / "run", "-u", "1", "-r", "1", "-t", "2s", "--workload", "custom",
                    "--dataset-path", str(rows))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if said in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert server.log() == [] and "Traceback" not in proc.stderr
