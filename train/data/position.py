"""A train loader's checkpointed position carried to another world size (the resume arithmetic).

A loader's position is (epoch, raw records consumed from this rank's stream, tokens carried into
the next batch), with the settings it was taken under (its fingerprint). On the same world size a
rank continues from its own position (``TrainLoader.load_state_dict``); on another one
``rederive_position`` computes each rank's from all of them, or says why it cannot be exact.
"""

from __future__ import annotations

from train.data.batcher import new_stats

STATE_VERSION = 1
# Fingerprint keys that follow from the others (the split mode from the source and the world
# size), so a checkpoint written before they were recorded is compared without them.
DERIVED_FINGERPRINT_KEYS = ("split",)


def rederive_position(saved: list[dict], fingerprint: dict) -> dict:
    """This rank's position (``fingerprint`` is its loader's) from the positions a run on
    ``len(saved)`` ranks checkpointed: raises ``ValueError`` saying why when it cannot be exact.

    The stream is shuffled before it is split one record per rank, round-robin, so while every
    rank has consumed the same number ``n`` of records of the epoch and holds no partial batch,
    the records consumed are exactly the first ``n x ranks`` of the shuffled stream, whatever the
    world size: a run on ``M`` ranks continues at ``n x ranks / M`` records per rank. Sources split
    by whole files (file count divisible by the world size), packed rows and ranks that skipped
    different numbers of unusable records break this. Counters (``stats``) are summed into rank 0.
    """
    ranks, world_size = len(saved), fingerprint["world_size"]
    ignored = ("rank", "world_size")
    config = {k: v for k, v in saved[0].get("config", {}).items() if k not in ignored}
    mine = {k: v for k, v in fingerprint.items() if k not in ignored}
    if "shards" in (config.pop("split", None), mine.pop("split")):
        raise ValueError(
            "the source is split among ranks by whole files, which depends on the world size; "
            f"resume on {ranks} rank(s)"
        )
    if config != mine:
        diff = {k: (config.get(k), v) for k, v in mine.items() if config.get(k) != v}
        raise ValueError(f"the data settings differ (saved, now): {diff}")
    positions = {(s["epoch"], s["records"], bool(s["carry"])) for s in saved}
    epoch, records, carry = positions.pop()
    if positions or carry:
        raise ValueError(
            "the ranks stopped at different points of the stream (packed rows, or unusable "
            f"records skipped unevenly); resume on {ranks} rank(s)"
        )
    total = records * ranks
    if total % world_size:
        raise ValueError(f"{total} records consumed do not split evenly over {world_size} ranks")
    stats = new_stats()
    if fingerprint["rank"] == 0:
        for s in saved:
            for key, value in s["stats"].items():
                stats[key] = stats.get(key, 0) + value
    stats["epoch"] = epoch
    return {
        "version": STATE_VERSION,
        "config": dict(fingerprint),
        "epoch": epoch,
        "records": total // world_size,
        "carry": [],
        "stats": stats,
    }
