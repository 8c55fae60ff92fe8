"""``python -m isan.train.ddp ARGS`` = ``isan train ARGS --distributed`` (run it under torchrun; see
:mod:`isan.train.ddp`). A command, so it stands above the layers: it imports the CLI, and nothing imports it."""

from __future__ import annotations

import sys

from isan.cli import main as cli


def main(argv: list[str] | None = None) -> None:
    """``python -m isan.train.ddp ARGS`` = ``isan train ARGS --distributed`` (run it under torchrun)."""
    args = list(sys.argv[1:] if argv is None else argv)
    cli.main(["train", *args, *([] if "--distributed" in args else ["--distributed"])], prog_name="isan.train.ddp")


if __name__ == "__main__":
    main()
