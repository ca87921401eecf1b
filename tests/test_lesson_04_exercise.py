"""Lesson 04, exercise 4 (ddp_scripts/04_checkpointing/resume_exercise.py with
resume_harness.py): typical wrong answers, launched, get the harness's verdict: a checkpoint
of the model alone resumes to other weights, a rank that does not wait finds no file, every
rank writing is refused."""
from tools.launch import REPO, launch

SAVE = REPO / "ddp_scripts" / "04_checkpointing/resume_exercise.py"

MODEL_ONLY_NO_BARRIER = '''
def save_checkpoint(path, model, optimizer, scheduler, step):
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), path)


def load_checkpoint(path, model, optimizer, scheduler):
    model.module.load_state_dict(torch.load(path, weights_only=True))
    return 18
'''
EVERY_RANK_WRITES = '''
def save_checkpoint(path, model, optimizer, scheduler, step):
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step}, path)
    dist.barrier()


def load_checkpoint(path, model, optimizer, scheduler):
    checkpoint = torch.load(path, weights_only=True)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    return checkpoint["step"]
'''


def answer(scripts_dir, functions):
    """The exercise script with the learner's two functions replaced by `functions` (the
    harness is in `scripts_dir` already)."""
    source = SAVE.read_text()
    start, end = source.index("\ndef save_checkpoint"), source.index('\nif __name__')
    script = scripts_dir / SAVE.name
    script.write_text(source[:start] + functions + "\n" + source[end:])
    return script


def problems(script, *args):
    result = launch(str(script), *args, nproc=2, out=True, timeout=90, echo=False)
    return [problem for rank in result.data["ranks"] for problem in rank["problems"]]


def test_model_only_without_a_barrier(scripts_dir):
    found = problems(answer(scripts_dir, MODEL_ONLY_NO_BARRIER), "--slow-disk", "3")
    assert ("rank 1 found no complete checkpoint.pt when save_checkpoint returned: the other "
            "ranks must wait until rank 0 has written it") in found
    assert not any(p.startswith("rank 0 found") for p in found)  # rank 0 wrote it
    for rank in (0, 1):  # momentum, learning rate and schedule were lost
        assert any(p.startswith(f"rank {rank}: the resumed weights differ") for p in found)


def test_every_rank_writing_is_refused(scripts_dir):
    found = problems(answer(scripts_dir, EVERY_RANK_WRITES))
    assert found == ["rank 1 called torch.save 1 times: only rank 0 writes the checkpoint "
                     "(every rank holds the same weights)"]
