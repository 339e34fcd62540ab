"""bench/serving/stages.py: py-spy's collapsed stacks put in stages, and a process's CPU split by them."""

from __future__ import annotations

import pytest

from bench.serving.stages import ENGINE_THREAD, OTHER, hot_frames, parse_raw, per_stage_ms, stage_of

RAW = """\
Thread.run (t.py:9);AsyncEngine._loop (engine/async_engine.py:240);LLMEngine.step (engine/llm_engine.py:300) 60
<module> (ray/_private/workers/default_worker.py:323);Worker.main_loop (ray/_private/worker.py:1069) 500
run (asyncio/base_events.py:1);Router.assign_request (ray/serve/_private/router.py:9);dumps (cloudpickle.py:1) 10
run (asyncio/base_events.py:1);Router.assign_request (ray/serve/_private/router.py:9) 20
run (asyncio/base_events.py:1);_run_once (asyncio/base_events.py:1900) 10
 3
"""


def test_stacks_go_to_the_innermost_stage_and_idle_loops_are_dropped() -> None:
    split = parse_raw(RAW)
    assert dict(split.samples) == {ENGINE_THREAD: 60, "carrier pickling": 10, "Serve routing and handle calls": 20,
                                   OTHER: 10}
    assert split.share()[ENGINE_THREAD] == pytest.approx(0.6)


def test_hot_frames_count_each_function_once_per_stack_without_idle_loops() -> None:
    hot = dict(hot_frames(RAW))  # 100 samples off the idle loop; Router.assign_request in 30 of them
    assert hot["run (asyncio/base_events.py)"] == pytest.approx(0.4)
    assert hot["Router.assign_request (ray/serve/_private/router.py)"] == pytest.approx(0.3)
    assert hot["LLMEngine.step (engine/llm_engine.py)"] == pytest.approx(0.6)
    assert "Worker.main_loop (ray/_private/worker.py)" not in hot


def test_rendering_inside_a_route_is_rendering() -> None:
    stack = ["generate (ingress/generate/routes.py:40)", "render_answer (ingress/generate/render.py:10)",
             "encode (json/encoder.py:200)"]
    assert stage_of(stack) == "JSON and rendering"
    assert stage_of(["validate (ingress/generate/validation.py:3)"]) == "validation"


def test_the_worker_engine_share_comes_from_its_threads_and_the_rest_from_its_samples() -> None:
    split = parse_raw(RAW)
    got = per_stage_ms({"worker": split, "proxy": split}, {"worker": 100.0, "proxy": 10.0}, engine_ms=80.0)
    # The rest of the worker (20 ms) split over the 40 non-engine samples.
    assert got["worker"] == pytest.approx({ENGINE_THREAD: 80.0, "carrier pickling": 5.0,
                                           "Serve routing and handle calls": 10.0, OTHER: 5.0})
    assert got["proxy"][ENGINE_THREAD] == pytest.approx(6.0)  # other roles: by samples alone
