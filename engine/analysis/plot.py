"""Attribution heatmaps (like Foerster et al. 2017, Figure 2). Needs matplotlib (``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_attribution(a, out: str | Path) -> Path:
    """Heatmap of each source's contribution to the logit of the next character; writes a PNG.

    Rows: sources (``<h0>``, then characters or words); columns: positions t, labelled with the
    character read at t. Colour: ``kappa[t, s, x_{t+1}]`` (logit units), diverging around 0.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isan.atomic import atomic_path

    M = a.next_char_contributions().T  # (S, T)
    S, T = M.shape
    vmax = float(np.abs(M).max()) or 1.0
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * T + 2), max(3, 0.28 * S + 1.5)))
    im = ax.imshow(M, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(T))
    ax.set_xticklabels(["_" if c == " " else c for c in a.text], fontsize=8)
    ax.set_yticks(range(S))
    ax.set_yticklabels([s.replace(" ", "_") for s in a.sources], fontsize=8)
    ax.set_xlabel("position t (character read); colour: contribution to the logit of the next character")
    ax.set_ylabel(f"source ({a.by})")
    fig.colorbar(im, ax=ax, label="kappa (logit units)")
    ax.set_title("ISAN exact attribution: kappa[t, s] for the next character")
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return out
