"""Lesson 04's claims about PyTorch that its run does not show in full, checked in one
process (no launch): what restores the learning rate, and what torch.load says about a
truncated checkpoint of any size."""
import io
import pickle

import pytest
import torch


def fresh_optimizer(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=lr, momentum=0.9)


def train(optimizer, scheduler, steps):
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: only the schedule matters here
        scheduler.step()
    return used


def test_step_lr_multiplies_the_rate_the_optimizer_holds():
    # Lesson 04: restoring the scheduler does not restore the rate; a fresh optimizer's
    # rate is then halved at each decay, so the rest of the run uses twice the rate.
    optimizer = fresh_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    train(optimizer, scheduler, 6)
    saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    reference = train(optimizer, scheduler, 6)

    both = fresh_optimizer()
    both_scheduler = torch.optim.lr_scheduler.StepLR(both, step_size=4, gamma=0.5)
    both.load_state_dict(saved["optimizer"])
    both_scheduler.load_state_dict(saved["scheduler"])
    assert train(both, both_scheduler, 6) == reference

    lost = fresh_optimizer()
    lost_scheduler = torch.optim.lr_scheduler.StepLR(lost, step_size=4, gamma=0.5)
    lost_scheduler.load_state_dict(saved["scheduler"])
    assert lost.param_groups[0]["lr"] == 0.1  # load_state_dict left the optimizer alone
    assert train(lost, lost_scheduler, 6) == [2 * lr for lr in reference]


def test_lambda_lr_sets_the_rate_again_at_its_next_step():
    # Lesson 04: a scheduler computing the rate from its count repairs it at its next
    # step(); the step before that uses the fresh optimizer's rate.
    def halve_every_4(step):
        return 0.5 ** (step // 4)

    optimizer = fresh_optimizer()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, halve_every_4)
    train(optimizer, scheduler, 6)
    saved = scheduler.state_dict()
    reference = train(optimizer, scheduler, 6)
    lost = fresh_optimizer()
    lost_scheduler = torch.optim.lr_scheduler.LambdaLR(lost, halve_every_4)
    lost_scheduler.load_state_dict(saved)
    resumed = train(lost, lost_scheduler, 6)
    assert resumed[0] == 0.1 != reference[0]
    assert resumed[1:] == reference[1:]


def saved_bytes(size):
    """torch.save of about `size` bytes."""
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(max(size // 4, 1))}, buffer)
    return buffer.getvalue()


def load_error(tmp_path, data):
    path = tmp_path / "cut.pt"
    path.write_bytes(data)
    with pytest.raises(Exception) as caught:
        torch.load(path, weights_only=True)
    return f"{caught.type.__name__}: {caught.value}"


CENTRAL = "PytorchStreamReader failed reading zip archive: failed finding central directory"


@pytest.mark.parametrize("cut_to", [100, 2000, 4000, 5000, 16_000, 40_000, 63_000, 68_000,
                                    70_000, 72_000, 200_000, 1_000_000])
def test_a_truncated_checkpoint_fails_by_its_length(tmp_path, cut_to):
    # Lesson 22 (torch 2.13): miniz searches backwards from the end in 4 KiB blocks, for
    # about 64 KiB; in between (4 KiB to about 68 KiB: 69,584 bytes by miniz's arithmetic),
    # its step past the start of the file is an invalid seek.
    error = load_error(tmp_path, saved_bytes(2 * cut_to)[:cut_to])
    if 4096 < cut_to < 69_584:
        assert error == "OSError: [Errno 22] Invalid argument"
    else:
        assert CENTRAL in error


def test_a_truncated_checkpoint_without_its_zip_signature(tmp_path):
    whole = saved_bytes(10_000)
    assert load_error(tmp_path, whole[:0]) == "EOFError: "
    assert load_error(tmp_path, whole[:2]).startswith("UnpicklingError: Weights only load failed")
    with pytest.raises(pickle.UnpicklingError):  # what that message suggests fails too
        torch.load(tmp_path / "cut.pt", weights_only=False)
    assert "not a ZIP archive" in load_error(tmp_path, whole[:10])


@pytest.mark.parametrize("cut_to, expected", [
    (0, "EOFError: "), (1, "UnpicklingError: Weights only load failed"),
    (3, "UnpicklingError: Weights only load failed"),
    (4, "RuntimeError: PytorchStreamReader failed reading zip archive: not a ZIP archive"),
    (21, "RuntimeError: PytorchStreamReader failed reading zip archive: not a ZIP archive"),
    (22, f"RuntimeError: {CENTRAL}"), (4096, f"RuntimeError: {CENTRAL}")])
def test_the_five_messages_of_a_short_checkpoint(tmp_path, cut_to, expected):
    # Lesson 22, the deep dive on cut files (torch 2.13): no signature below 4 bytes (the
    # pre-zip reader); below 22 bytes, shorter than the zip's end record: miniz says "not a
    # ZIP archive"; from 22 bytes to one 4 KiB block, it finds no central directory.
    assert load_error(tmp_path, saved_bytes(10_000)[:cut_to]).startswith(expected)
