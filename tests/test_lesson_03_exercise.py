"""Lesson 03, exercise 3 (ddp_scripts/03_ddp_training/training_exercise.py): the tempting
fix, averaging the ranks' accuracies with ReduceOp.AVG, reports the mean of the ranks'
accuracies, which is not the accuracy over the whole evaluation set when the ranks' parts
differ in size (25 samples on 2 ranks: 13 and 12)."""
from tools.launch import REPO, launch

SOLUTION = """\
        totals = torch.tensor(evaluate(model, *evaluation))  # this rank's correct, count
        dist.all_reduce(totals)  # sums over all ranks
        reported.append(totals[0].item() / totals[1].item())
"""
AVERAGED = """\
        correct, count = evaluate(model, *evaluation)
        accuracy = torch.tensor(correct / count, dtype=torch.float64)
        dist.all_reduce(accuracy, op=dist.ReduceOp.AVG)  # the mean of the ranks' accuracies
        reported.append(accuracy.item())
"""


def test_averaging_the_ranks_accuracies_is_not_the_global_accuracy(scripts_dir):
    source = (REPO / "ddp_scripts" / "03_ddp_training/training_exercise.py").read_text()
    assert source.count(SOLUTION) == 1
    script = scripts_dir / "training_averaged.py"
    script.write_text(source.replace(SOLUTION, AVERAGED))
    result = launch(str(script), nproc=2, out=True, timeout=90, echo=False)
    ranks, reported = result.data["ranks"], result.data["reported"]
    assert len(reported) >= 2
    for epoch, accuracy in enumerate(reported):
        parts = [log["part"][epoch] for log in ranks]  # [correct, count] per rank
        assert [count for _, count in parts] == [13, 12]
        assert accuracy == sum(correct / count for correct, count in parts) / 2  # what AVG gives
        whole = sum(correct for correct, _ in parts) / 25  # the parts make the whole set
        assert abs(accuracy - whole) > 1e-3, (epoch, accuracy, whole)  # measurably wrong
