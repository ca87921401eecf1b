"""Exercise (lesson 31): a pipeline step with micro-batches (the GPipe schedule). Cut the
batch into `micro` micro-batches; stage 0 sends each one's activations as soon as it has
computed them, stage 1 computes each one's loss as it arrives and then sends the
gradients back, and the step must equal one step on the whole batch. The run around it is
in gpipe_harness.py.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/31_pipeline_ddp/gpipe_exercise.py
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gpipe_harness import lesson, run_exercise


def gpipe_step(model, stage, partner, x, y, micro):
    """One step of this rank's stage; gradients end in model's parameters' .grad."""
    # STUB: lesson.train_step(model, stage, partner, x, y)  # the whole batch at once
    ### BEGIN SOLUTION
    if stage == 0:
        outputs = []
        for piece in x.chunk(micro):  # forward all micro-batches, sending each at once
            h = model(piece)
            dist.send(h.detach(), partner)
            outputs.append(h)
        grads = [torch.empty_like(h) for h in outputs]
        for grad in grads:  # then collect their gradients
            dist.recv(grad, partner)
        torch.autograd.backward(outputs, grads)  # one backward through all of them
    else:
        grads = []
        for target in y.chunk(micro):  # each micro-batch as soon as it arrives
            h = torch.empty(len(target), lesson.WIDTH, dtype=torch.float64)
            dist.recv(h, partner)
            h.requires_grad_()
            (F.mse_loss(model(h), target) / micro).backward()  # a mean over the whole batch
            grads.append(h.grad)
        for grad in grads:  # then the gradients: stage 0 sends every micro-batch first
            dist.send(grad, partner)
    ### END SOLUTION


if __name__ == "__main__":
    run_exercise(gpipe_step)
