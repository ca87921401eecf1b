"""tools/judge.py: the process that runs the script exercises' checks, away from the
student's code. Each job's results come back; one that runs past its time is stopped and
says so, and what it left does not reach the next job; a judge that was killed says so."""

import os
import signal

from tools.judge import Judge

RECORD = ("import json\n"
          "with open(__judge_results__, 'a') as f:\n"
          "    f.write(json.dumps({'exercise': 1, 'stage': 'check', 'part': 0,\n"
          "                        'status': 'passed', 'from': os.getpid()}) + '\\n')")


def job(tmp_path, *cells):
    return {"cells": ["import os", *cells], "cwd": str(tmp_path), "marker_name": "JUDGE_TEST",
            "marker": "1"}


def test_a_judge_runs_jobs_and_survives_one_that_hangs(tmp_path):
    judge = Judge({"key.json": "{}"})
    try:
        entries, why = judge.run(job(tmp_path, RECORD, "assert __judge_cache__ == "
                                     "{'key.json': '{}'}", RECORD), limit=60)
        assert why == "" and len(entries) == 2, (entries, why)
        assert entries[0]["from"] != os.getpid()  # another process
        # a job that hangs after one result: stopped at the limit, the result kept
        entries, why = judge.run(job(tmp_path, RECORD, "import time\ntime.sleep(600)"),
                                 limit=3)
        assert len(entries) == 1 and "ran past its time" in why, (entries, why)
        entries, why = judge.run(job(tmp_path, RECORD), limit=60)  # the next one: clean
        assert why == "" and len(entries) == 1, (entries, why)
        os.kill(judge.pid, signal.SIGKILL)  # a student's code kills the judge
        os.waitpid(judge.pid, 0)
        entries, why = judge.run(job(tmp_path, RECORD), limit=10)
        assert entries == [] and "the judge" in why and "stopped it" in why, why
    finally:
        judge.close()
