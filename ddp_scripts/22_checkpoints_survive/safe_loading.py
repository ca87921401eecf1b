"""Lesson 22, section 7: weights_only=True refuses a checkpoint that runs code when it is
unpickled; weights_only=False runs it. Needs no process group (one rank is enough):

    torchrun --standalone --nproc-per-node=1 ddp_scripts/22_checkpoints_survive/safe_loading.py
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from ddp_common import arguments, record, require_torchrun, write_json


class RunsCodeWhenLoaded:
    """A pickle can name any function to call when it is loaded. This one names
    open(marker, "w"): harmless, but it proves that loading ran code of our choosing."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def load_error(path):
    """What torch.load(path, weights_only=True) raises, as text (None: it loaded)."""
    try:
        torch.load(path, weights_only=True)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


@record
def main():
    args = arguments(__doc__).parse_args()
    require_torchrun()
    with tempfile.TemporaryDirectory() as folder:
        crafted, marker = Path(folder) / "crafted.pt", Path(folder) / "code-ran-here.txt"
        torch.save({"weights": torch.ones(2), "extra": RunsCodeWhenLoaded(marker)}, crafted)
        found = {"weights_only_error": load_error(crafted),
                 "code_ran_with_weights_only": marker.exists()}
        loaded = torch.load(crafted, weights_only=False)  # only ever for a file you made
        loaded["extra"].close()  # it is the file object that open() returned
        found["code_ran_without_weights_only"] = marker.exists()
        numpy_state = Path(folder) / "numpy-state.pt"
        torch.save({"numpy_rng": np.random.get_state()}, numpy_state)
        found["numpy_error"] = load_error(numpy_state)
    if args.out:
        write_json(args.out, found)


if __name__ == "__main__":
    main()
