"""Launch like torch: ``torchrun -m verify`` (gloo on the CPU here), and the untagged
transport's header check between two real processes.

Each test starts real processes with deadlines (a few seconds each on a loaded machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from verify.torchrun import TorchrunPlace, torchrun_place  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.dist, pytest.mark.timeout(300)]


def _torchrun(nproc: int, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(nproc), "-m", "verify", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=cwd)


def test_torchrun_runs_one_rank_per_process_and_rank_0_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    costs = tmp_path / "costs.json"
    done = _torchrun(
        2,
        *("1f1b", "-p", "2", "-m", "4", "--warmup", "0", "--timeout", "120", "--json"),
        *("--output", str(report), "--costs-out", str(costs)),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""  # rank 0 wrote the report to the file; no rank printed it
    data = json.loads(report.read_text())
    assert data["bit_identical"] is True and data["devices"] == ["cpu", "cpu"]
    # the chapter's MLP, as in `pipesim verify --dist`
    assert data["param_bytes"] == [43_776, 38_800] and data["transfer_bytes"] == [[3_072] * 4]
    assert json.loads(costs.read_text())["meta"]["schedule"] == "1f1b"
    assert "Traceback" not in done.stderr


def test_torchrun_with_the_wrong_process_count_says_how_many(tmp_path: Path) -> None:
    done = _torchrun(3, "1f1b", "-p", "2", "-m", "2", cwd=tmp_path)
    assert done.returncode != 0
    assert (
        "pipesim: error: torchrun started 3 processes for a schedule of 2 ranks; use torchrun "
        "--nproc-per-node 2" in done.stderr
    )


def test_torchrun_place_reads_the_environment() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
    }
    assert torchrun_place(env) == TorchrunPlace(rank=3, world_size=4, local_rank=1)
    assert torchrun_place({k: v for k, v in env.items() if k != "RANK"}) is None


_PAIR = """
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from pipesim.actions import parse_action
from pipesim.comms import Message
from verify.transport import OrderedTransport, TransportError


def message(k):
    return Message(producer=parse_action(f"0F{k}"), consumer=parse_action(f"1F{k}"),
                   src_rank=0, dst_rank=1, index=k)


def main(rank, folder, case):
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    m0, m1 = message(0), message(1)
    sent_shape = (3, 2) if case == "shape" and rank == 0 else (2, 3)
    shapes = {m0: (sent_shape, torch.float32), m1: ((2, 3), torch.float32)}
    transport = OrderedTransport(rank=rank, device=torch.device("cpu"), shapes=shapes,
                                 timeout_s=30)
    try:
        if rank == 0:
            order = [m1, m0] if case == "swap" else [m0, m1]
            for m in order:
                transport.send(m, torch.full(shapes[m][0], float(m.index)))
            transport.finish()
        else:
            transport.post(m0)
            transport.post(m1)
            a, b = transport.take(m0), transport.take(m1)
            print("received", float(a[0, 0]), float(b[0, 0]))
    except TransportError as exc:
        print("error:", exc)
    sys.stdout.flush()
    import os
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
"""


def _pair(tmp_path: Path, case: str) -> str:
    folder = tmp_path / case
    folder.mkdir()
    script = folder / "pair.py"
    script.write_text(textwrap.dedent(_PAIR))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(folder), case],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = []
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=120)[0])
        finally:
            proc.kill()
    return outs[1].strip()


def test_messages_in_order_arrive_whole(tmp_path: Path) -> None:
    assert _pair(tmp_path, "ok") == "received 0.0 1.0"


def test_a_message_out_of_order_is_an_error_naming_sender_receiver_and_action(
    tmp_path: Path,
) -> None:
    assert _pair(tmp_path, "swap") == (
        "error: rank 1 expected 0F0 -> 1F0 from rank 0 as torch.float32 [2, 3], but received "
        "0F1 -> 1F1 from rank 0 to rank 1 as torch.float32 [2, 3]; the two ranks disagree on "
        "the order or the shape of their messages"
    )


def test_a_message_of_another_shape_is_an_error_before_its_payload_is_used(
    tmp_path: Path,
) -> None:
    assert _pair(tmp_path, "shape") == (
        "error: rank 1 expected 0F0 -> 1F0 from rank 0 as torch.float32 [2, 3], but received "
        "0F0 -> 1F0 from rank 0 to rank 1 as torch.float32 [3, 2]; the two ranks disagree on "
        "the order or the shape of their messages"
    )
