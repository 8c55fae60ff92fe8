"""Data-parallel training (isan.train.ddp): 2 CPU processes (gloo) on one machine give the parameters of a
single process with the full batch, write the same checkpoint files, and resume in either direction."""

import json
import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from isan.train import models  # noqa: E402
from isan.train.loop import TrainConfig, Trainer  # noqa: E402

from conftest import DATA, need  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

#: the largest parameter difference allowed between 2 processes and 1 (float32 rounding of the
#: gradient's sum over two halves of the batch instead of one, through a few Adam steps)
ATOL = 1e-5


class _AuxISAN(models.ISAN):
    """An ISAN with an auxiliary loss (an L1 penalty on W, annealed by the progress fraction)."""

    kind = "isan_aux_ddp_test"

    def aux_loss(self, progress_fraction):
        return 1e-2 * progress_fraction * self.W.abs().sum()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _configs(data: str) -> list[tuple[str, dict]]:
    """(run name, TrainConfig fields): an ISAN on bytes (input_map), an LSTM on characters (a tuple state),
    the parentheses task (its own data, targets and loss), an ISAN with an auxiliary loss."""
    base = dict(params=None, data=data, dataset="text", batch_size=8, bptt=16, lr=3e-3, eval_every=0.01,
                valid_streams=4, max_valid_chars=1_000, ckpt_every=2, log_every=2, max_steps=4, seed=0, threads=1)
    return [("isan-bytes", {**base, "model": "isan", "d": 8, "alphabet": "bytes", "inputs": 20}),
            ("lstm-chars", {**base, "model": "lstm", "d": 8}),
            ("parentheses", {**base, "model": "parentheses", "d": 8, "batch_size": 32}),
            ("isan-aux", {**base, "model": _AuxISAN.kind, "d": 8})]


def _worker(rank: int, world: int, port: int, data: str, root: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    models.MODELS[_AuxISAN.kind] = _AuxISAN  # this child process only
    from isan.train.ddp import init_from_env, shutdown

    ctx = init_from_env("cpu")
    try:
        for name, fields in _configs(data):
            Trainer(TrainConfig(**fields), os.path.join(root, name), progress_bar=False, dist=ctx).run()
    finally:
        shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same runs on 2 processes and on 1 (4 steps each), the 2-process ones in one spawn."""
    text = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    root = tmp_path_factory.mktemp("ddp")
    data = root / "data.txt"
    data.write_text(text, encoding="utf-8")
    mp.spawn(_worker, args=(2, _free_port(), str(data), str(root / "two")), nprocs=2, join=True)
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setitem(models.MODELS, _AuxISAN.kind, _AuxISAN)
        for name, fields in _configs(str(data)):
            Trainer(TrainConfig(**fields), root / "one" / name, progress_bar=False).run()
    return root, str(data)


def _weights(path):
    return load_file(str(path / "latest" / "weights.safetensors"))


@pytest.mark.parametrize("name", ["isan-bytes", "lstm-chars", "parentheses", "isan-aux"])
def test_two_processes_equal_one(runs, name):
    root, _ = runs
    one, two = _weights(root / "one" / name), _weights(root / "two" / name)
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=ATOL, msg=lambda m: f"{name} {k}: {m}")
    # the same checkpoint files, the carried state of both ranks gathered into the one checkpoint
    o1 = load_file(str(root / "one" / name / "latest" / "optimizer.safetensors"))
    o2 = load_file(str(root / "two" / name / "latest" / "optimizer.safetensors"))
    assert o1.keys() == o2.keys() and any(k.startswith("carry.") for k in o1)
    for k in o1:
        torch.testing.assert_close(o2[k], o1[k], rtol=0, atol=1e-4)
    p1 = json.loads((root / "one" / name / "latest" / "progress.json").read_text())
    p2 = json.loads((root / "two" / name / "latest" / "progress.json").read_text())
    B = 32 if name == "parentheses" else 8
    assert (p2["step"], p2["chars_seen"]) == (p1["step"], p1["chars_seen"]) == (4, 4 * 16 * B)
    assert p2["best_valid_bpc"] == pytest.approx(p1["best_valid_bpc"], abs=1e-4)
    log = [json.loads(line) for line in (root / "two" / name / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["processes"] == 2 and sum(e["event"] == "start" for e in log) == 1  # rank 0 alone logs
    steps = [e for e in log if e["event"] == "step"]
    ref = [json.loads(line) for line in (root / "one" / name / "train_log.jsonl").read_text().splitlines()]
    if name == "isan-aux":  # the auxiliary loss is logged, the same on 2 processes as on 1
        assert [e["aux_loss"] for e in steps] == pytest.approx([e["aux_loss"] for e in ref if e["event"] == "step"],
                                                              abs=1e-5)
    key = "train_mse" if name == "parentheses" else "train_bpc"
    assert [e[key] for e in steps] == pytest.approx([e[key] for e in ref if e["event"] == "step"], abs=1e-4)


def test_a_two_process_run_resumes_in_one(runs, tmp_path):
    """The checkpoint of a 2-process run resumes in a single process to the weights that the
    checkpoint of a single-process run resumes to."""
    import shutil

    root, data = runs
    name, fields = _configs(data)[1]
    ends = {}
    for src in ("one", "two"):
        out = tmp_path / src
        shutil.copytree(root / src / name, out)
        tr = Trainer(TrainConfig(**fields), out, progress_bar=False, overrides={"max_steps": 6})
        assert tr.resumed and tr.progress.step == 4
        tr.run()
        ends[src] = _weights(out)
    for k in ends["one"]:
        torch.testing.assert_close(ends["two"][k], ends["one"][k], rtol=0, atol=ATOL)


def test_uneven_split_is_a_clear_error():
    from isan.errors import IsanError
    from isan.train.ddp import DistContext

    with pytest.raises(IsanError, match="divisible"):
        DistContext(rank=0, world=3, local_rank=0, device="cpu", backend="gloo").shard(8)
