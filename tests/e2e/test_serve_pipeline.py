"""Pipeline parallelism across Ray nodes: the tiny Llama at pipeline_parallel_size 2 on a two-node cluster of this
machine (tests/helpers/pipeline_cluster.py, in its own process: a process holds one Ray), one stage per node; rows
over HTTP equal transformers' within 1e-4; the second node lost under a load loop: every answer exact, or a 503 with
Retry-After, the replica back, nothing of the old group left."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ATOL = 1e-4
BACK_S = 180  # loss of the node -> the first exact answer sent after it (a new node, a new replica, two loads)


@pytest.fixture(scope="module")
def facts() -> dict:
    # PYTHONPATH keeps tests/loopback_site/ (tests/conftest.py): Serve's replicas bind on loopback only.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ["PYTHONPATH"]])}
    run = subprocess.run([sys.executable, "-m", "tests.helpers.pipeline_cluster"], env=env, capture_output=True,
                         text=True, timeout=900)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no facts (rc {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return json.loads(lines[-1])


def _check_rows(rows: dict) -> None:
    assert rows["score_diff"] <= ATOL and rows["warm_diff"] <= ATOL and rows["warm_cached"] > 0
    assert rows["greedy_argmax"] and rows["greedy_diff"] <= ATOL and rows["greedy_tokens"] == 6


def test_two_stages_on_two_nodes_answer_exactly(facts: dict) -> None:
    placement = facts["placement"]
    assert placement["strategy"] == ["PACK"]
    assert len(placement["nodes"][0]) == 2 and facts["second_node"] in placement["nodes"][0]  # a stage per node
    _check_rows(facts["rows"])


def test_a_lost_stage_node_loses_no_request(facts: dict) -> None:
    fault = facts["fault"]
    answers = fault["answers"]
    assert fault["before"] > 0 and len(answers) > fault["before"]  # load before and after the loss
    for status, retry_after, exact in answers:
        assert (status == 200 and exact) or (status == 503 and retry_after), (status, retry_after)
    assert fault["back_s"] is not None and fault["back_s"] <= BACK_S
    # The old group is gone: its rank actor, and every process of it (the replica held rank 0's rendezvous port).
    assert fault["old_ranks_left"] == [] and fault["new_ranks"] == 1
    assert fault["old_pids"] == 2 and fault["old_pids_alive"] == 0 and fault["new_pids"] == 2
    _check_rows(facts["rows_after"])
