"""The CI workflow and the GPU check script: valid, with the jobs and steps they need.

The GPU job cannot run here; what can be checked without a GPU is: the workflow is valid
YAML with a CPU job running the README's test command and a GPU job on a self-hosted GPU
runner that runs scripts/gpu_check.sh and uploads its reports, and the script itself is
valid bash that, without a GPU, says so in its one summary line and exits 3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

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
    runs = _runs(cpu)
    assert "make test" in runs
    # Ubuntu's apt chromium is a snap shim that does not run on GitHub's runners: nothing
    # installs it; a step before `make test` points BROWSER_PATH at the runner's Chrome.
    assert not any("apt-get" in r or "browser-deps" in r for r in runs)
    assert runs.index(_browser_step(cpu)["run"]) < runs.index("make test")


def _browser_step(job: dict) -> dict:  # type: ignore[type-arg]
    (step,) = [s for s in job["steps"] if "BROWSER_PATH" in s.get("run", "")]
    return step  # type: ignore[no-any-return]


def _fake_browser(folder: Path, name: str) -> Path:
    folder.mkdir(exist_ok=True)
    browser = folder / name
    browser.write_text("#!/bin/sh\necho 'Google Chrome 131.0.6778.85'\n")
    browser.chmod(0o755)
    return browser


@pytest.mark.parametrize("found_by", ["CHROME_BIN", "PATH", "nothing"])
def test_the_browser_step_exports_the_runners_chrome(found_by: str, tmp_path: Path) -> None:
    # The step's own script, run by bash as the runner would: GITHUB_ENV is the file whose
    # NAME=value lines the later steps (make test) get as environment variables.
    script = _browser_step(_workflow()["jobs"]["cpu"])["run"]
    env_file = tmp_path / "github_env"
    bash = shutil.which("bash")
    assert bash is not None
    # no google-chrome on the PATH but the fake one (the script needs shell builtins only)
    env = {"GITHUB_ENV": str(env_file), "PATH": str(tmp_path / "empty")}
    expected = None
    if found_by == "CHROME_BIN":  # GitHub's images set it
        expected = _fake_browser(tmp_path / "opt", "chrome")
        env["CHROME_BIN"] = str(expected)
    elif found_by == "PATH":
        expected = _fake_browser(tmp_path / "bin", "google-chrome")
        env["PATH"] = str(expected.parent)
    done = subprocess.run(
        [bash, "-e", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    if expected is None:
        assert done.returncode == 1 and "::error::no Google Chrome on this runner" in done.stdout
        assert not env_file.exists()
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout == "Google Chrome 131.0.6778.85\n"
        assert env_file.read_text() == f"BROWSER_PATH={expected}\n"


def test_browser_path_is_what_the_tests_and_make_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import browser_path

    chrome = _fake_browser(tmp_path / "opt", "chrome")
    monkeypatch.setenv("BROWSER_PATH", str(chrome))
    assert browser_path() == str(chrome)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "missing"))
    with pytest.raises(pytest.fail.Exception, match="is not an executable file"):
        browser_path()
    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setenv("PATH", str(_fake_browser(tmp_path / "bin", "chromium").parent))
    assert browser_path() == str(tmp_path / "bin" / "chromium")
    # make browser-deps: BROWSER_PATH is enough (silent); without it and without chromium
    # on the PATH it names the fixes (the PATH has no `id` either, so it never runs apt).
    make = ["/usr/bin/make", "-s", "-C", str(ROOT), "browser-deps"]
    empty = {"PATH": str(tmp_path / "empty")}
    quiet = subprocess.run(
        make,
        env={**empty, "BROWSER_PATH": str(chrome)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stderr
    hint = subprocess.run(make, env=empty, capture_output=True, text=True, timeout=30)
    assert "or set BROWSER_PATH to a Chrome binary" in hint.stdout


def test_gpu_job_runs_the_gpu_check_on_a_gpu_runner_and_uploads_its_outputs() -> None:
    gpu = _workflow()["jobs"]["gpu"]
    assert {"self-hosted", "gpu"} <= set(gpu["runs-on"])
    runs = _runs(gpu)
    assert any("scripts/gpu_check.sh gpu-check-out" in r for r in runs)
    assert any("pip install -e '.[dev,verify]'" in r for r in runs)
    # The runner's CUDA torch is kept: a venv that sees it, and gpu_check.sh runs in it.
    assert any("-m venv .venv-gpu" in r and "runner-site.pth" in r for r in runs)
    check = next(s for s in gpu["steps"] if "gpu_check.sh" in s.get("run", ""))
    assert check["env"]["PYTHON"] == ".venv-gpu/bin/python"
    # No code from forks on a self-hosted runner.
    assert "head.repo.full_name == github.repository" in gpu["if"]
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


def _gpu_check(tmp_path: Path, python: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHON=python, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def _fake_python(tmp_path: Path, probe: str, *, broken: bool = False) -> str:
    """A stand-in for the runner's Python: answers the torch probes as a machine with CUDA
    torch would, records and fakes the checks (zbv's report differs), and runs the script's
    summary with the real Python. ``broken``: the CUDA tests skip and a bf16 model's
    messages go over NCCL as float32."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(f"""
        import json, os, sys
        args = sys.argv[1:]
        with open({str(tmp_path / "calls.txt")!r}, "a") as calls:
            calls.write(" ".join(args) + "\\n")
        if args[0] == "-c":
            if "version.cuda or" in args[1]:
                print({probe!r})
            else:
                print("cuda:0 Fake GPU" if "range(" in args[1] else "Fake GPU")
        elif args[:2] == ["-m", "pytest"]:
            for a in args:
                if a.startswith("--junitxml="):
                    skipped = 3 if {broken!r} else 0
                    open(a.split("=", 1)[1], "w").write(f'<testsuite skipped="{{skipped}}"/>')
        elif "verify" in args:
            out = args[args.index("--output") + 1]
            same = "zbv" not in args
            bf16 = "bf16" in args and "--dtype" in args
            amp = "fp32, autocast bf16" if "--autocast" in args else "fp32"
            precision = "bf16" if bf16 else amp
            wire = ["float32" if {broken!r} or not bf16 else "bfloat16"]
            json.dump({{"bit_identical": same, "measured_makespan": 0.0021,
                       "makespan_error_percent": 4.4, "precision": precision,
                       "wire_bytes": [8, 8] if "torch.distributed.run" in args else None,
                       "wire_dtypes": wire}}, open(out, "w"))
            sys.exit(0 if same else 1)
        else:
            os.execv({sys.executable!r}, [{sys.executable!r}, *args])
        """)
    )
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.slow
def test_gpu_check_says_why_the_environment_cannot_run_it_and_exits_3(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    done = _gpu_check(tmp_path, sys.executable)  # the CPU build of torch CI installs
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        f"gpu_check: FAIL torch {torch.__version__} in {sys.executable} is a CPU build; "
        "install a CUDA build of torch >= 2.4"
    ]
    done = _gpu_check(tmp_path, "/bin/false")  # no torch at all
    assert done.returncode == 3
    assert done.stdout.startswith("gpu_check: FAIL /bin/false cannot import torch; set PYTHON")
    done = _gpu_check(tmp_path, _fake_python(tmp_path, "0 12.4 2.5.1+cu124"))  # none visible
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        "gpu_check: FAIL no CUDA GPU visible (torch.cuda.device_count() == 0)"
    ]


@pytest.mark.slow
def test_gpu_check_on_two_gpus_runs_every_check_and_writes_junit(tmp_path: Path) -> None:
    done = _gpu_check(tmp_path, _fake_python(tmp_path, "2 12.4 2.5.1+cu124"))
    out = tmp_path / "out"
    assert done.returncode == 1, done.stderr  # zbv's report differs
    assert done.stdout.splitlines() == [
        "gpu_check: FAIL verify-zbv-nccl(exit-1) on 2x Fake GPU (torch 2.5.1+cu124, CUDA "
        "12.4): gpt-autocast-cuda0 fp32, autocast bf16 bit-identical 2.1ms(pred +4%); "
        "gpt-cuda0 fp32 bit-identical 2.1ms(pred +4%); llama-bf16-cuda0 bf16 bit-identical "
        "2.1ms(pred +4%); llama-bf16-nccl bf16 bit-identical 2.1ms(pred +4%); mlp-cuda0 fp32 "
        "bit-identical 2.1ms(pred +4%); mlp-nccl fp32 bit-identical 2.1ms(pred +4%); zbv-nccl "
        f"fp32 DIFFERS 2.1ms(pred +4%); see {out}/*.log.txt"
    ]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert sum("--device cuda:0" in c for c in calls) == 4  # the one-process executor
    assert sum("--dtype bf16" in c for c in calls) == 2 and sum("--autocast" in c for c in calls)
    torchrun = [c for c in calls if c.startswith("-m torch.distributed.run")]
    assert len(torchrun) == 3 and all("--nproc-per-node 2 -m verify" in c for c in torchrun)
    suite = ElementTree.parse(out / "gpu-check.xml").getroot()
    cases = {c.get("name"): c.find("failure") for c in suite.iter("testcase")}
    assert set(cases) == {
        "cuda-tests",
        "verify-mlp-cuda0",
        "verify-gpt-cuda0",
        "verify-llama-bf16-cuda0",
        "verify-gpt-autocast-cuda0",
        "verify-mlp-nccl",
        "verify-zbv-nccl",
        "verify-llama-bf16-nccl",
    }
    assert [n for n, f in cases.items() if f is not None] == ["verify-zbv-nccl"]
    assert (out / "cuda-tests.xml").exists() and (out / "verify-mlp-cuda0.json").exists()


def test_gpu_check_fails_when_cuda_tests_skip_or_bf16_travels_as_float32(tmp_path: Path) -> None:
    # A CUDA test that skipped did not run on the GPU; a bf16 model's messages sent as
    # float32 are not what the check is for: both fail the run, never a silent pass.
    done = _gpu_check(tmp_path, _fake_python(tmp_path, "2 12.4 2.5.1+cu124", broken=True))
    assert done.returncode == 1
    line = done.stdout.splitlines()[-1]
    assert line.startswith(
        "gpu_check: FAIL verify-zbv-nccl(exit-1) verify-llama-bf16-nccl(wire-not-bf16) "
        "cuda-tests(3-skipped) on 2x Fake GPU"
    )
    assert "llama-bf16-nccl bf16 bit-identical WIRE-NOT-BF16(['float32'])" in line
    suite = ElementTree.parse(tmp_path / "out" / "gpu-check.xml").getroot()
    failing = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert failing == {"cuda-tests", "verify-llama-bf16-nccl", "verify-zbv-nccl"}
