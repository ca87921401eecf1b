"""Lesson 00, DDP in ten minutes: exercise 1's check names what a wrong DDP script got wrong
(each typical mistake is launched for real, and the notebook's own check cell judges it),
and the reference solution with that check also holds on a model with a frozen layer and
tied weights, not only on the lesson's network. Also: the plain script and the DDP script
refuse bad input clearly, and `write_results` keeps every rank's numbers."""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.course import NOTEBOOKS, REPO
from tools.launch import launch

LESSON = NOTEBOOKS / "00_ddp_in_ten_minutes.ipynb"
EXERCISE = "00_ddp_in_ten_minutes/ddp_exercise.py"  # in ddp_scripts/
PLAIN = "00_ddp_in_ten_minutes/train_plain.py"


def check_cell() -> str:
    nb = nbformat.read(LESSON, as_version=4)
    return next(c.source for c in nb.cells if "check" in c.metadata.get("tags", [])
                and EXERCISE in c.source)


def judge(result, plain, world_size=2):
    """Run exercise 1's check cell on `result` (the learner's launch) against `plain`."""
    namespace = {"launch": lambda *args, **kwargs: result, "exercise_timeout": 90,
                 "cpu_unless_enough_gpus": lambda n: {}, "world_size": world_size,
                 "plain": plain, "plain_samples": plain.data["ranks"][0]["samples"]}
    exec(check_cell(), namespace)


@pytest.fixture(scope="module")
def plain():
    return launch("ddp_scripts/00_ddp_in_ten_minutes/train_plain.py", nproc=None, out=True,
                  timeout=120,
                  echo=False)


def variant(scripts_dir, replacements: dict[str, str]):
    """The reference solution with some of its lines changed, in a folder of its own."""
    source = (REPO / "ddp_scripts" / EXERCISE).read_text()
    for old, new in replacements.items():
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    script = scripts_dir / Path(EXERCISE).name
    script.write_text(source)
    return launch(str(script), nproc=2, out=True, timeout=120, echo=False)


WRONG = {
    "no DistributedSampler": (
        {"    sampler = DistributedSampler(train_set, seed=0)\n":
         "    sampler = torch.utils.data.RandomSampler(train_set, generator=torch.Generator())\n",
         "        sampler.set_epoch(epoch)\n": "        sampler.generator.manual_seed(epoch)\n"},
        r"rank 0 trained on 3072 samples; with 2 ranks each should take 1/2 of the plain "
        r"run's 3072 \(DistributedSampler\)"),
    "the whole batch on every rank": (
        {"batch_size=args.batch // world_size": "batch_size=args.batch"},
        r"the weights differ from the plain run's by up to .*keep the global batch"),
    "no set_epoch": (
        {"        sampler.set_epoch(epoch)\n": "        pass\n"},
        r"the weights differ from the plain run's by up to .*sampler.set_epoch"),
    "no DDP": (
        {"    model = DDP(make_model().to(device))\n": "    model = make_model().to(device)\n"},
        r"the ranks ended with different weights: wrap the model in DDP"),
}


@pytest.mark.parametrize("mistake", WRONG)
def test_exercise_1s_check_names_the_mistake(mistake, plain, scripts_dir):
    replacements, message = WRONG[mistake]
    result = variant(scripts_dir, replacements)
    with pytest.raises(AssertionError, match=message):
        judge(result, plain)


def test_the_untouched_plain_script_on_two_ranks_is_refused(plain, scripts_dir):
    """The stub: every process trains alone on all the data, and only rank 0 writes."""
    script = scripts_dir / "plain_on_two_ranks.py"
    script.write_text((REPO / "ddp_scripts" / PLAIN).read_text())
    result = launch(str(script), nproc=2, out=True, timeout=120, echo=False)
    assert result.data["world_size"] == 1
    assert result.data["weights"] == plain.data["weights"]  # the plain run, bit for bit
    with pytest.raises(AssertionError, match="the processes never joined one job"):
        judge(result, plain)


FROZEN_AND_TIED = '''

def make_model():  # the same network, its first layer frozen, and a Linear layer used twice
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 96, 3, padding=1), nn.Tanh(),
        nn.Conv2d(96, 96, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(96 * 8 * 8, 10))
    tied = nn.Linear(10, 10)
    model.extend([tied, nn.Tanh(), tied])
    model[0].requires_grad_(False)
    return model
'''


def test_the_solution_and_its_check_hold_with_frozen_and_tied_weights(scripts_dir):
    import torch

    shared = REPO / "ddp_scripts" / "shared" / "digits_cnn.py"  # this copy comes first
    (scripts_dir / "digits_cnn.py").write_text(shared.read_text() + FROZEN_AND_TIED)
    for name in (PLAIN, EXERCISE):
        (scripts_dir / Path(name).name).write_text((REPO / "ddp_scripts" / name).read_text())
    plain = launch(str(scripts_dir / Path(PLAIN).name), nproc=None, out=True, timeout=120,
                   echo=False)
    result = launch(str(scripts_dir / Path(EXERCISE).name), nproc=2, out=True, timeout=120,
                    echo=False)
    judge(result, plain)  # passes
    n_weights = 320 + 27744 + 83040 + 61450 + 110  # the tied layer's weights counted once
    assert len(result.data["weights"]) == len(plain.data["weights"]) == n_weights
    torch.manual_seed(0)
    first = torch.nn.Conv2d(1, 32, 3, padding=1)  # the frozen layer as it was made
    made = torch.cat([first.weight.detach().flatten(), first.bias.detach()]).tolist()
    assert result.data["weights"][:320] == plain.data["weights"][:320] == made  # never moved


def test_a_batch_that_does_not_split_evenly_is_refused():
    result = launch("ddp_scripts/00_ddp_in_ten_minutes/train_ddp.py", "--batch", 191, nproc=2,
                    timeout=120, echo=False, expect_failure=True)
    assert "--batch 191 does not split evenly over 2 ranks" in result.output


def test_write_results_without_a_group_writes_one_process(tmp_path):
    out = tmp_path / "found.json"
    code = ("import torch; from ddp_common import write_results; "
            f"write_results({str(out)!r}, torch.nn.Linear(2, 1), samples=3)")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120)
    found = json.loads(out.read_text())
    assert found["world_size"] == 1 and found["ranks"][0]["samples"] == 3
    assert len(found["weights"]) == 3 and re.fullmatch(r"[0-9a-f]{64}",
                                                       found["ranks"][0]["weights_sha256"])
    assert not list(tmp_path.glob("*.partial"))


def test_the_digits_are_scikit_learns():
    """digits_cnn.py reads load_digits' own file without importing scikit-learn."""
    import importlib

    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    digits = importlib.import_module("digits_cnn")  # ddp_scripts/shared/, importable in .venv
    train, (test_x, test_y) = digits.load_data()
    x = torch.cat([train.tensors[0], test_x]).flatten(1) * 16
    y = torch.cat([train.tensors[1], test_y])
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    reference = load_digits()
    assert np.array_equal(x.numpy(), reference.data[order.numpy()].astype(np.float32))
    assert np.array_equal(y.numpy(), reference.target[order.numpy()])
    assert len(train) == 1536
