"""The parentheses counting task of section 4 (train/tasks/parentheses.py) against plain Python."""

from __future__ import annotations

import json

import numpy as np
import pytest

from isan.train.tasks.parentheses import SYMBOLS, ParenthesesTask, task_for


def plain_counts(ids, kinds=2, top=5):
    c = [0] * kinds
    out = []
    for x in ids:
        for k in range(kinds):
            if x == 2 * k:
                c[k] = min(c[k] + 1, top)
            elif x == 2 * k + 1:
                c[k] = max(c[k] - 1, 0)
        out.append(list(c))
    return np.array(out)


def test_counts_saturate_like_plain_python():
    task = ParenthesesTask()
    ids = task.sample(3000, seed=1)
    assert set(np.unique(ids)) == set(range(5)) and task.alphabet.symbols == tuple(SYMBOLS)
    c = task.counts(ids)
    np.testing.assert_array_equal(c, plain_counts(ids))
    assert c.min() == 0 and c.max() == 5  # both ends are reached in 3,000 symbols
    # batched (T, B) equals column by column
    X = task.sample(600, seed=2).reshape(200, 3)
    np.testing.assert_array_equal(task.counts(X)[:, 1], plain_counts(X[:, 1]))
    ids = np.array([0] * 7 + [1] * 9 + [2, 3, 3, 4])
    assert plain_counts(ids)[6].tolist() == [5, 0] and task.counts(ids)[15].tolist() == [0, 0]


def test_targets_are_the_counts_delayed():
    """Position t reads the state after symbol t - 1 and must report the counts after symbol t - 2."""
    task = ParenthesesTask()
    ids = task.sample(500, seed=3)
    c = plain_counts(ids)
    t = task.target_counts(ids)
    np.testing.assert_array_equal(t[:2], 0)
    np.testing.assert_array_equal(t[2:], c[:-2])
    Y = task.k_hot(t)
    assert Y.shape == (500, 12) and np.all(Y.sum(1) == 2)
    np.testing.assert_array_equal(task.decode(Y), t)


def test_loss_and_stream_targets():
    torch = pytest.importorskip("torch")
    task = ParenthesesTask()
    X = torch.as_tensor(task.sample(64, seed=4).reshape(16, 4))
    Y = task.stream_targets(X)
    assert Y.shape == (16, 4, 12)
    np.testing.assert_array_equal(Y.numpy(), task.k_hot(task.target_counts(X.numpy())))
    out = torch.zeros_like(Y)
    assert float(task.loss(out, Y)) == pytest.approx(2 / 12)  # two ones among 12 outputs
    assert task_for("parentheses") is not None and task_for("isan") is None


def test_isan_train_parentheses_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from isan.cli import main

    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["train", "parentheses", "--d", "12", "--out", str(out), "--max-steps", "20",
                                  "--batch-size", "64", "--bptt", "16", "--lr", "0.01", "--no-progress",
                                  "--threads", "1"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == {"kind": "isan", "K": 5, "V": 12, "d": 12} and cfg["task"]["task"] == "parentheses"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert any("train_mse" in e for e in log)
