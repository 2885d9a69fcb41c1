"""``TextStream``: text deltas that hold back what could begin a stop string, and tokens cut at the one that
completed it whatever the pushes were."""

from __future__ import annotations

from recguide_trt.text_stream import TextStream

PIECES = {1: "ab", 2: "c", 3: "de", 4: "f", 5: "gh", 6: "\ufffd"}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_one_push_or_many_cut_at_the_same_token():
    one = TextStream(decode, ["cd"])
    assert one.push([1, 2, 3, 4, 5]) == "ab" and one.stopped
    assert one.ids == [1, 2, 3] and one.sent == "ab" and one.finish() == ""
    many = TextStream(decode, ["cd"])
    deltas = [many.push([t]) for t in [1, 2, 3, 4, 5]]
    assert "".join(deltas) == "ab" and many.ids == [1, 2, 3]


def test_held_back_text_comes_out_when_no_stop_follows():
    s = TextStream(decode, ["xyz"])
    assert s.push([1, 2]) == "a"          # "bc" could begin "xyz"? no, but two characters are held back
    assert s.push([3]) == "bc"
    assert s.finish() == "de" and not s.stopped and s.ids == [1, 2, 3]


def test_a_split_character_waits_and_no_stop_means_everything():
    s = TextStream(decode)
    assert s.push([1, 6]) == "ab"
    assert s.push([2]) == "\ufffdc" and s.finish() == ""
