"""checks/config_lifetime.py's parts on real processes and sockets: which configs are shipped Serve configs, what a
GPU config runs with on a machine without one, the reload's config change, the dashboard address in a launcher's
log, and the process table: a run's processes found by session and by the folders they name, the ports they listen
on, and leftovers recorded and then killed. (A whole round takes minutes: `python -m checks.config_lifetime`.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from checks import config_lifetime, process_table
from checks.config_lifetime import CPU_FIT, Round, dashboard_url, fit, reloaded, shipped, table
from deploy.config import AppConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_every_serve_config_is_shipped_and_nothing_else() -> None:
    names = [p.name for p in shipped()]
    assert names == sorted(names) and {"local.yaml", "cluster.yaml", "tp.yaml"} <= set(names)
    assert "prometheus.yml" not in names and all(p.suffix == ".yaml" for p in shipped())


def test_a_gpu_config_runs_on_cpu_only_without_a_gpu() -> None:
    cluster = yaml.safe_load((CONFIGS / "cluster.yaml").read_text())
    assert fit(cluster, has_gpu=True) == {} and fit(cluster, has_gpu=False) == CPU_FIT
    assert fit(yaml.safe_load((CONFIGS / "local.yaml").read_text()), has_gpu=False) == {}
    fitted = AppConfig.model_validate({**cluster["applications"][0]["args"], **CPU_FIT})
    assert fitted.device == "cpu" and fitted.worker_num_gpus == 0


def test_the_reload_changes_one_args_field_of_a_copy() -> None:
    config = yaml.safe_load((CONFIGS / "local.yaml").read_text())
    before = AppConfig.model_validate(config["applications"][0]["args"]).max_batch_items
    out = reloaded(config)
    assert out["applications"][0]["args"]["max_batch_items"] == before + 1
    assert "max_batch_items" not in config["applications"][0]["args"]  # the original is untouched
    assert {k: v for k, v in out["applications"][0]["args"].items() if k != "max_batch_items"} == \
        config["applications"][0]["args"]


def test_the_dashboard_address_is_read_from_the_log() -> None:
    log = ("2026-12-06 07:30:26,294\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at "
           "\x1b[1m\x1b[32mhttp://127.0.0.1:8266 \x1b[39m\x1b[22m\n")
    assert dashboard_url(log) == "http://127.0.0.1:8266" and dashboard_url("no dashboard") is None


def _group(code: str) -> subprocess.Popen:
    """A Python process as a session leader (as the launcher is started) running `code`."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)


def test_a_runs_processes_and_ports_are_found_by_session_and_by_folder(tmp_path: Path) -> None:
    leader = _group("import socket, subprocess, sys, time\n"
                    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                    "print(child.pid, s.getsockname()[1], flush=True); time.sleep(60)")
    # Outside the session, but naming the run's folder (as HAProxy names its config file).
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "haproxy.cfg")],
                                start_new_session=True)
    try:
        child, port = map(int, leader.stdout.readline().split())  # type: ignore[union-attr]
        found = {p.pid for p in process_table.of_run(leader.pid, [str(tmp_path)])}
        assert found == {leader.pid, child, outsider.pid}
        assert {p.pid for p in process_table.of_run(leader.pid, [])} == {leader.pid, child}
        assert process_table.listening_ports(found) == {port: leader.pid}
        assert port in process_table.listening() and process_table.port_owner(port).pid == leader.pid
    finally:
        for proc in (leader, outsider):
            proc.kill()
            proc.wait(10)


def test_leftovers_are_recorded_then_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_lifetime, "SETTLE_S", 1.0)
    leader = _group("import os, socket, subprocess, sys, time\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
                    "print(s.getsockname()[1], flush=True); time.sleep(60)")
    port = int(leader.stdout.readline())  # type: ignore[union-attr]
    ports = process_table.listening_ports(p.pid for p in process_table.of_run(leader.pid, []))
    result = Round("x.yaml", 1, signal.SIGINT.name)
    config_lifetime.leftovers(result, leader.pid, [], ports)
    assert len(result.left) == 2 and str(leader.pid) in " ".join(result.left) and not result.ok
    assert result.ports == [port] and len(result.ports_left) == 1 and result.ports_left[0].startswith(f"{port} (")
    leader.wait(10)  # killed by leftovers()
    deadline = time.monotonic() + 10
    while process_table.of_run(leader.pid, []) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in process_table.of_run(leader.pid, []) if p.state != "Z"] == []
    assert port not in process_table.listening()


def test_a_clean_round_is_ok_and_the_table_says_so() -> None:
    clean = Round("local.yaml", 1, "SIGINT", start_s=50.0, reload_s=40.0, stop_s=30.0, haproxy_started=8)
    dirty = Round("cluster.yaml", 2, "SIGTERM", fitted=True, left=["1 haproxy"], zombies=1)
    assert clean.ok and not dirty.ok
    text = table([clean, dirty]).splitlines()
    assert len(text) == 3 and text[1].split(" | ")[-1].strip() == "ok" and "(CPU fit)" in text[2]
    assert text[2].split(" | ")[-1].strip() == "leftovers" and "1 +1 zombie" in text[2]
