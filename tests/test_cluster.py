"""Lesson 32's cluster (tools/cluster.py): the hosts are what the lesson says they are, and
nothing is ever left behind, whether the set-up fails half-way, the process exits without
tearing down, or the kernel running the lesson is killed.

These tests need Linux and root. Elsewhere they are skipped with the reason, except where
DDP_COURSE_REQUIRE_CLUSTER=1 (CI sets it): there a machine that cannot run them fails them."""
import os
import signal
import socket
import subprocess
import sys

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from tools import cluster
from tools.course import REPO, execute

REASON = cluster.why_not()


@pytest.fixture
def clean():
    """Needs a machine that can run the cluster; nothing of ours before, nothing after."""
    if REASON:
        if os.environ.get("DDP_COURSE_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"DDP_COURSE_REQUIRE_CLUSTER=1, but: {REASON}")
        pytest.skip(REASON)
    # A run killed with SIGKILL (a session's end, CI's timeout) leaves its hosts behind: its
    # owner is dead, so they are removed here, as cluster.up() would; a live owner's stay.
    stale = cluster.leftovers()
    if cluster.down_if_up():
        print(f"removed what a killed run left: {stale}")
    assert cluster.leftovers() == [], "another process has the cluster up"
    yield
    left = cluster.leftovers()
    cluster.down_if_up()
    assert left == [], "left behind"


def test_a_learner_without_root_is_told_why_and_what_to_do(monkeypatch):
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    reason = cluster.why_not()
    assert "needs root" in reason and "--privileged" in reason and "real cluster" in reason
    monkeypatch.setattr(cluster.sys, "platform", "darwin")
    assert "not Linux" in cluster.why_not()
    with pytest.raises(cluster.ClusterError, match="cannot make the cluster here"):
        cluster.up()


def test_each_host_has_its_own_name_address_and_hosts_file(clean):
    mine = socket.gethostname()
    hosts_before = open("/etc/hosts").read()
    cluster.up(with_slurm=False)
    try:
        for host, address in cluster.HOSTS.items():
            assert cluster.run_on(host, "hostname").stdout.strip() == host
            shown = cluster.run_on(host, "ip", "-brief", "address", "show", "eth0").stdout
            assert f"{address}/24" in shown
            assert cluster.run_on(host, "getent", "hosts", host).stdout.split()[0] == "127.0.1.1"
        assert cluster.run_on("nodeB", "getent", "hosts", "nodeA").stdout.split()[0] == \
            cluster.HOSTS["nodeA"]
        # nodeB reaches a server on nodeA's address over the bridge
        server = subprocess.Popen(cluster.on("nodeA", [
            sys.executable, "-c", "import socket; s = socket.create_server(('10.77.0.1', 29999));"
            " print('ready', flush=True); c, _ = s.accept(); c.sendall(b'hello from nodeA')"]),
            stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        reply = cluster.run_on("nodeB", sys.executable, "-c",
                               "import socket; print(socket.create_connection(('nodeA', 29999),"
                               " timeout=5).recv(100).decode())").stdout.strip()
        assert reply == "hello from nodeA"
        assert server.wait(timeout=10) == 0
        # a host cannot reach this machine's own network: it has only the bridge
        routes = cluster.run_on("nodeB", "ip", "route").stdout
        assert routes.strip() == "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.2"
    finally:
        cluster.down()
    assert socket.gethostname() == mine and open("/etc/hosts").read() == hosts_before


def test_a_setup_that_fails_half_way_removes_what_it_made(clean, monkeypatch):
    broken = cluster.slurm_conf() + "NoSuchSlurmOption=1\n"  # slurmctld refuses to start
    monkeypatch.setattr(cluster, "slurm_conf", lambda: broken)
    with pytest.raises(cluster.ClusterError, match="slurmctld"):
        cluster.up()
    assert cluster.leftovers() == []


def test_a_process_that_exits_without_down_leaves_nothing(clean):
    done = subprocess.run([sys.executable, "-c", "from tools import cluster\ncluster.up()\n"
                           "print(cluster.slurm('sinfo', '-h', '-N', '-o', '%N %T'))\n"
                           "raise SystemExit(3)"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout.split() == ["nodeA", "idle", "nodeB", "idle"]
    assert cluster.leftovers() == []


def test_a_second_cluster_is_refused_while_one_is_up(clean):
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom tools import cluster\n"
                               "cluster.up(with_slurm=False)\nprint('up', flush=True)\n"
                               "sys.stdin.read()"], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        result = subprocess.run([sys.executable, "-c", "from tools import cluster\n"
                                 "cluster.up(with_slurm=False)"], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0
        assert "another process has the cluster up" in result.stderr
        assert cluster.run_on("nodeA", "hostname").stdout.strip() == "nodeA"  # untouched
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert cluster.leftovers() == []


def _killed_with_its_daemons():
    """A cluster whose owner and Slurm daemons were all SIGKILLed, as when a session ends or
    a CI job times out: no exit handler ran, so the hosts, links and folder are left."""
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom tools import cluster\n"
                               "cluster.up()\nprint('up', flush=True)\ntime.sleep(300)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    daemons = []  # so that a holder that never came up fails on its own assert
    try:
        assert holder.stdout.readline().strip() == "up"
        daemons = cluster.our_slurm_processes()
        assert len(daemons) == 3  # slurmctld on nodeA, one slurmd per host
    finally:
        holder.kill()
        holder.wait(timeout=10)
    cluster._kill(daemons, signal.SIGKILL)
    left = cluster.leftovers()
    assert left[0].startswith("network namespaces") and "Slurm" not in str(left)


def test_what_a_killed_run_left_is_removed_by_the_next_run(clean):
    _killed_with_its_daemons()
    cluster.up()  # as lesson 32 starts: the killed run's hosts are replaced
    try:
        assert cluster.slurm("sinfo", "-h", "-N", "-o", "%N %T").split() == \
            ["nodeA", "idle", "nodeB", "idle"]
    finally:
        cluster.down()
    _killed_with_its_daemons()
    assert cluster.down_if_up() is True  # as the tests and tools.course start
    assert cluster.leftovers() == []


def test_a_killed_kernel_leaves_nothing(clean, workspace, tmp_path, capsys):
    """The kernel dies (SIGKILL: no exit handler runs); tools.course.execute, which runs
    every lesson, removes what it left."""
    parameters = new_code_cell("world_size = 2")
    parameters.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[parameters, new_code_cell(
        "import os, signal, sys\nfrom pathlib import Path\n"
        "sys.path.insert(0, str(Path.cwd().parent))\nfrom tools import cluster\n"
        "cluster.up()\nos.kill(os.getpid(), signal.SIGKILL)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    with pytest.raises(Exception, match="(?i)dead|died|kernel"):
        execute(nb, tmp_path / "killed.ipynb", workspace)
    assert "killed.ipynb: removed the cluster its kernel left" in capsys.readouterr().out
    assert cluster.leftovers() == []


def test_down_with_nothing_up_is_harmless(clean):
    cluster.down()
    cluster.down()
    assert cluster.down_if_up() is False


def test_only_the_cluster_lessons_can_be_skipped_and_never_where_ci_requires_it(monkeypatch):
    from tools.course import NOTEBOOKS, lessons, why_not_here

    monkeypatch.setattr(cluster, "why_not", lambda: "no root here")
    monkeypatch.delenv("DDP_COURSE_REQUIRE_CLUSTER", raising=False)
    refused = [path.stem for path in lessons() if why_not_here(path)]
    assert refused == ["26_elastic", "32_clusters", "34_slow_link"]
    monkeypatch.setenv("DDP_COURSE_REQUIRE_CLUSTER", "1")  # CI: run it, and fail if it cannot
    assert why_not_here(NOTEBOOKS / "32_clusters.ipynb") is None
    assert why_not_here(NOTEBOOKS / "34_slow_link.ipynb") is None
