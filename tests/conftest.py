import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.course import make_workspace  # noqa: E402


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """One copy of the course for the whole session: lessons execute there, never in
    the repository."""
    return make_workspace(tmp_path_factory.mktemp("course"))
