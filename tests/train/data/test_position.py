"""train/data/position.py: a saved data position re-derived for another world size, exactly or not
at all."""

from __future__ import annotations

import pytest

from train.data.position import rederive_position


def _position(rank: int, world_size: int, records: int, carry: list | None = None) -> dict:
    config = {"seq_len": 8, "rank": rank, "world_size": world_size, "split": "records"}
    return {"version": 1, "config": config, "epoch": 0, "records": records, "carry": carry or []}


def test_rederive_position_two_ranks_to_one_and_back():
    two = [{**_position(r, 2, 6), "stats": {"records": 6, "tokens": 18}} for r in (0, 1)]
    one = rederive_position(two, {"seq_len": 8, "rank": 0, "world_size": 1, "split": "records"})
    assert (one["records"], one["carry"], one["stats"]["tokens"]) == (12, [], 36)
    back = [{**one, "config": _position(0, 1, 12)["config"]}]
    again = rederive_position(back, {"seq_len": 8, "rank": 1, "world_size": 2, "split": "records"})
    assert again["records"] == 6 and again["stats"]["tokens"] == 0  # counters stay on rank 0


@pytest.mark.parametrize(
    ("saved", "reason"),
    [
        ([_position(0, 2, 6), _position(1, 2, 5)], "different points of the stream"),
        ([_position(0, 2, 6, [[1, 2]]), _position(1, 2, 6, [[3]])], "different points"),
        ([_position(0, 2, 3), _position(1, 2, 3)], "do not split evenly over 4 ranks"),
    ],
)
def test_rederive_position_refuses_what_it_cannot_make_exact(saved, reason):
    mine = {"seq_len": 8, "rank": 0, "world_size": 4, "split": "records"}
    if "evenly" not in reason:
        mine["world_size"] = 1
    for s in saved:
        s["stats"] = {}
    with pytest.raises(ValueError, match=reason):
        rederive_position(saved, mine)
