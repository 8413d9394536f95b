"""How every figure of the tables is saved, so that committed PNGs regenerate byte for byte."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: Path, *axes) -> Path:
    """Grid on each of ``axes`` and its legend below it (inside, a legend can hide a point), and a
    PNG without a timestamp or version, so the bytes depend on the data."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path
