"""One reader's work timed in one process: each input file cut into the job's parts, each part
prepared and handed over as a reader process hands it (into shared memory, then removed here), with
no process, queue or scorer around it: how many characters a second one reader sustains.

The readers' bench (``python -m isan.bench.corpus DATA_DIR --readers 1 --before SITE``) runs this
file by its path in a fresh process with this isan, and with an older one on ``PYTHONPATH``: it
uses only what both have (an older isan's reader pickled a part instead).

Run: ``python reader_timing.py PATHS_JSON WORK_DIR``; prints ``{"seconds", "chars", "chars_per_s"}``.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path


def time_reader(paths: list[str], work: Path) -> dict:
    """Seconds one reader takes over ``paths`` (the default job and model), the characters it read
    (documents' sizes) and their rate. ``work``: a folder for the parts' names (nothing is written)."""
    from isan.engine.corpus.parts import FileParts, JobConfig, load_corpus_engine
    from isan.engine.corpus.prepared import TextPreparer, prepare_docs

    try:
        from isan.engine.corpus import shared_parts
    except ImportError:  # an isan before the parts went through shared memory
        shared_parts = None
    engine = load_corpus_engine(None)
    preparer, cfg, chars = TextPreparer.of(engine), JobConfig(params_sha256=engine.params_sha256), 0
    t = time.perf_counter()
    for i, path in enumerate(paths):
        for part, docs, file_error in FileParts(cfg, path, Path(work)).cut():
            prepared = prepare_docs(preparer, docs, cfg.normalize, cfg.unknown, cfg.replacement, cfg.row_max_chars)
            chars += sum(d.size for d in docs)
            if shared_parts is None:
                pickle.dumps(prepared, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                shared_parts.put((str(part), prepared, file_error), name := f"{shared_parts.job_prefix()}{i}")
                shared_parts.remove(name)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "chars": chars, "chars_per_s": chars / seconds}


if __name__ == "__main__":
    print(json.dumps(time_reader(json.loads(sys.argv[-2]), Path(sys.argv[-1]))))
