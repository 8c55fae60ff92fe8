"""The analysed models' quality beside the paper's model, for the figures' headings.

A model's test bpc is read from its committed score file, never typed in: ``results/scoring/NAME.text8_test.json``
(``isan score --json`` on text8-10M's test split; ``bash results/scoring/score.sh`` writes them) or, for the
Fig 1b baselines, ``results/paper/models/NAME.score.json`` (the same command's answer;
``bash train/studies/paper_baselines.sh``). NAME is the bundle's folder name. A model without such a file
(any bundle of a user's own) is headed by its name and the paper's number only.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import isan.errors as isan_errors
from isan.errors import IsanError

#: the paper's model, in bits per character on the paper's test split of text8: "All analyses use ISAN trained
#: with 1.28e6 maximum parameters (1.58 bpc cross entropy)" (Foerster et al., ICML 2017, Sec 3.1; its Table 1
#: gives the ISAN at 1.28e6 the same 1.58, "measured as cross-entropy loss on a held-out test set")
PAPER_TEST_BPC = 1.58
#: where the paper states :data:`PAPER_TEST_BPC`
PAPER_TEST_BPC_CITED = "ICML Sec 3.1"
#: a model's committed test score, relative to the repository root (NAME: the bundle's folder name), in order
SCORE_FILES = ("results/scoring/{name}.text8_test.json", "results/paper/models/{name}.score.json")


def repository_root() -> Path:
    """The checkout's root, the folder above the ``isan`` package (where ``results/`` lies)."""
    return Path(isan_errors.__file__).resolve().parents[1]


def model_name(label: str) -> str:
    """The bundle name in a figure's model label: NAME for Fig 1b's ``"isan (NAME)"``, else the label itself."""
    m = re.fullmatch(r"[a-z_]+ \((.+)\)", label)
    return m.group(1) if m else label


def committed_test_bpc(name: str, root: str | Path | None = None) -> tuple[float, Path] | None:
    """The test bpc of the bundle ``name`` and the committed file it comes from (:data:`SCORE_FILES`, the
    first that exists under ``root``, default :func:`repository_root`), or None when there is none.

    Raises:
        IsanError: the file exists but is not JSON or has no finite ``bpc``.
    """
    root = repository_root() if root is None else Path(root)
    for pattern in SCORE_FILES:
        path = root / pattern.format(name=name)
        if path.is_file():
            try:
                bpc = json.loads(path.read_text(encoding="utf-8")).get("bpc")
            except (json.JSONDecodeError, AttributeError) as e:
                raise IsanError(f"{path} is not the JSON of `isan score --json` ({e}); score the model again") from None
            if not isinstance(bpc, (int, float)) or not math.isfinite(bpc):
                raise IsanError(f"{path} has no finite 'bpc'; score the model again with `isan score --json`")
            return float(bpc), path
    return None


def paper_bpc_note() -> str:
    """``"the paper's model: 1.58 bpc (ICML Sec 3.1)"``, from :data:`PAPER_TEST_BPC`."""
    return f"the paper's model: {PAPER_TEST_BPC:.2f} bpc ({PAPER_TEST_BPC_CITED})"


def model_bpc(label: str, root: str | Path | None = None) -> str:
    """``"1.777 bpc"``: the test bpc of a model with a committed score (:func:`committed_test_bpc`), else ``""``."""
    found = committed_test_bpc(model_name(label), root)
    return "" if found is None else f"{found[0]:.3f} bpc"


def model_title(label: str, root: str | Path | None = None) -> str:
    """A figure's heading for one model, two lines: ``"model: NAME"``, then its committed test bpc (when there
    is one, :func:`model_bpc`) beside the paper's model's (:func:`paper_bpc_note`)."""
    ours = model_bpc(label, root)
    return f"model: {label}\n" + (f"{ours} on text8-10M's test split; " if ours else "") + paper_bpc_note()


def parentheses_title(d: int, n_params: int, model: str | None = None) -> str:
    """Fig 9's heading: the parentheses ISAN of Sec 4 (``model``: where it lies), its width and size; it is
    trained on counts with an L2 loss, so it has no bpc to set beside the paper's language model."""
    where = f" ({model})" if model else ""
    return (f"model: the parentheses ISAN of Sec 4{where}, d = {d}, {n_params:,} parameters; trained on the "
            "counting task with an L2 loss (no bpc)")
