"""The synthetic conversation generator writes ShareGPT that the conversation source reads."""

from __future__ import annotations

import json

import pytest

from vllm_locust.core import conversationgen


def test_conversations_alternate_turns_and_are_seeded(tmp_path):
    out = tmp_path / "c.json"
    assert conversationgen.main(["--out", str(out), "--conversations", "6", "--turns", "4", "--turns-min", "2",
                                 "--turn-words", "7", "--reply-words", "3", "--system-words", "5", "--seed", "3"]) == 0
    data = json.loads(out.read_text())
    assert len(data) == 6
    for entry in data:
        turns = entry["conversations"]
        assert turns[0]["from"] == "system" and len(turns[0]["value"].split()) == 5
        body = turns[1:]
        assert [t["from"] for t in body] == ["human", "gpt"] * (len(body) // 2)
        assert 2 <= len(body) // 2 <= 4
        assert all(len(t["value"].split()) == (7 if t["from"] == "human" else 3) for t in body)
    again = conversationgen.conversations(6, 4, 7, 3, 5, 2, seed=3)
    assert again == data, "the same seed writes the same file"
    assert conversationgen.conversations(6, 4, 7, 3, 5, 2, seed=4) != data


@pytest.mark.parametrize("args", [["--turns", "0"], ["--turn-words", "0"], ["--turns", "3", "--turns-min", "4"]])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, args):
    assert conversationgen.main(["--out", str(tmp_path / "x.json"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("conversationgen: ") and "\n" not in err
    assert not (tmp_path / "x.json").exists()
