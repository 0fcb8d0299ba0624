"""The CI workflow and the GPU check script: valid, with the jobs and steps they need.

The GPU job cannot run here; what can be checked without a GPU is: the workflow is valid
YAML with a CPU job running the README's test command and a GPU job on a self-hosted GPU
runner that runs scripts/gpu_check.sh and uploads its reports, and the script itself is
valid bash that, without a GPU, says so in its one summary line and exits 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _workflow() -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def _runs(job: dict) -> list[str]:  # type: ignore[type-arg]
    return [step.get("run", "") for step in job["steps"]]


def test_workflow_is_valid_yaml_with_triggers_and_two_jobs() -> None:
    data = _workflow()
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as "on".
    triggers = data.get("on", data.get(True))
    assert {"push", "pull_request"} <= set(triggers)
    assert set(data["jobs"]) == {"cpu", "gpu"}
    for job in data["jobs"].values():
        assert job["timeout-minutes"] <= 60
        assert job["steps"][0]["uses"].startswith("actions/checkout@")


def test_cpu_job_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme  # the README's test command
    cpu = _workflow()["jobs"]["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    assert "make test" in _runs(cpu)
    # chromium for the browser tests needs root; make test alone would only print a hint
    assert any("browser-deps" in r and r.startswith("sudo") for r in _runs(cpu))


def test_gpu_job_runs_the_gpu_check_on_a_gpu_runner_and_uploads_its_outputs() -> None:
    gpu = _workflow()["jobs"]["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"])
    runs = _runs(gpu)
    assert any("scripts/gpu_check.sh gpu-check-out" in r for r in runs)
    assert any("pip install -e '.[dev,verify]'" in r for r in runs)
    upload = next(
        s for s in gpu["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")
    )
    assert upload["if"] == "always()"  # reports of a failed check are what one needs most
    paths = upload["with"]["path"]
    for pattern in ("gpu-check-out/*.json", "gpu-check-out/*.xml"):
        assert pattern in paths


def test_gpu_check_script_is_valid_bash_covering_one_and_many_gpus() -> None:
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert "--device cuda:0" in text  # one GPU: every rank on cuda:0
    assert "torch.distributed.run" in text and "-m verify" in text  # two or more: torchrun
    assert "--junitxml" in text and "--costs-out" in text


def test_gpu_check_without_a_gpu_prints_one_summary_line_and_exits_3(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        "gpu_check: FAIL no CUDA GPU visible (torch.cuda.device_count() == 0)"
    ]
