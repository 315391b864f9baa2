"""Session and connection behaviour that needs no trainer: PID checks, readonly, jump hosts,
telemetry parsing, option parsing."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from console.core.deploy import code_folder, resolve_code_folder
from console.core.devices import join_devices
from console.core.events import ActionPhase, Gpu, Outcome, TelemetryState
from console.core.launching import RestartPlan, restart_plan
from console.core.options import ConnectOptions
from console.core.place import Proxmox
from console.core.session import ReadOnlyError, Session
from console.core.ssh import HostKeyRefused, _parse_jump
from console.core.telemetry import nvidia_smi_argv, parse_gpu_line, parse_output
from console.core.trainer_argv import flag_value, is_trainer_cmdline, set_flag
from tests.support.core_util import CT, alive, options_for, start_user_script, wait_until
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True)


async def test_pid_that_became_another_program_is_refused(host):
    p = start_user_script(host.container_dir(CT), "runs/x")
    run_dir = str(host.container_dir(CT) / "runs" / "x")
    try:
        async with Session(
            options_for(host), place=Proxmox(CT), run_dir=run_dir, telemetry=False, streams=False
        ) as s:
            assert s.trainer is not None and s.trainer.pid == p.pid and s.trainer.source == "cmdline"
            os.kill(p.pid, signal.SIGUSR1)  # it execs `sleep 30`: same PID, same start time, other program
            cmdline = Path(f"/proc/{p.pid}/cmdline")
            await asyncio.to_thread(wait_until, lambda: cmdline.read_bytes().startswith(b"sleep"), 10, "exec")
            phases: list[ActionPhase] = []
            res = await s.stop_trainer(timeout=10, on_phase=phases.append)
        assert res.code == Outcome.REFUSED, res
        assert [ph.phase for ph in phases] == ["verifying", "refused"]
        assert "sleep 30" in res.message
        assert alive(p.pid) and p.poll() is None  # no signal reached it
    finally:
        p.kill()
        p.wait()


async def test_user_script_stop_watches_its_output_dir_and_sees_the_exit(host):
    """The workflow's own script (no run.json, no events): an open-ended saving phase that names the
    file it writes, with its size, as it grows; the exit learned at once; exit 0 + a new file: OK."""
    p = start_user_script(host.container_dir(CT), "runs/y", STANDIN_SAVE_S="1.5")
    run_dir = str(host.container_dir(CT) / "runs" / "y")
    try:
        async with Session(options_for(host), place=Proxmox(CT), run_dir=run_dir, telemetry=False) as s:
            phases: list[ActionPhase] = []
            res = await s.stop_trainer(timeout=30, on_phase=phases.append)
            assert res.code == Outcome.OK, res
            names = [ph.phase for ph in phases]
            assert names[:3] == ["verifying", "signal_sent", "saving"] and names[-2:] == ["saved", "exited"]
            assert phases[2].expected_s is None and run_dir in phases[2].detail  # open-ended, watching
            writing = [ph.detail for ph in phases if ph.phase == "saving" and "writing in" in ph.detail]
            assert writing and "checkpoint_step_100.pt (97.7 KB)" in writing[0], names  # the first half
            assert "checkpoint_step_100.pt (195.3 KB)" in phases[-2].detail  # what was written in the end
            assert "exit code 0" in res.message and "checkpoint_step_100.pt" in res.message
            assert s.trainer is None
        assert p.wait(5) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"STANDIN_WRITE": "0"}, "without writing anything new in"),
        ({"STANDIN_RC": "1"}, "but with exit code 1"),
    ],
)
async def test_user_script_that_writes_nothing_or_fails_is_no_checkpoint(host, env, said):
    p = start_user_script(host.container_dir(CT), "runs/z", STANDIN_SAVE_S="0.1", **env)
    run_dir = str(host.container_dir(CT) / "runs" / "z")
    try:
        async with Session(options_for(host), place=Proxmox(CT), run_dir=run_dir, telemetry=False) as s:
            res = await s.stop_trainer(timeout=30)
        assert res.code == Outcome.NO_CHECKPOINT and said in res.message, res
        assert p.wait(5) == int(env.get("STANDIN_RC", "0"))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


async def test_readonly_session_refuses_every_change(host, tmp_path):
    async with Session(
        options_for(host), place=Proxmox(CT), run_dir=str(tmp_path), readonly=True, telemetry=False
    ) as s:
        for call in (
            s.stop_trainer(),
            s.restart_trainer(),
            s.deploy(),
            s.launch(["--output-dir", str(tmp_path)]),
        ):
            with pytest.raises(ReadOnlyError):
                await call
        assert await s.read_log_tail(5) == []  # reading is fine
    assert not (host.container_dir(CT) / ".dflash-console").exists()


async def test_no_nvidia_smi_is_a_state_not_a_crash(host, tmp_path):
    seen: list = []
    async with Session(options_for(host), place=Proxmox(CT), run_dir=str(tmp_path)) as s:
        s.subscribe(seen.append)
        for _ in range(200):
            if any(isinstance(e, TelemetryState) for e in seen):
                break
            await asyncio.sleep(0.02)
        tel = [e for e in seen if isinstance(e, TelemetryState)]
        assert tel and tel[0].available is False and "nvidia-smi" in tel[0].detail
        assert s.connected  # the session carries on


async def test_jump_host_and_unknown_key(host, tmp_path):
    opts = options_for(host, jump=f"{host.user}@127.0.0.1:{host.port}")
    async with Session(opts, place=Proxmox(CT), run_dir=str(tmp_path), telemetry=False, streams=False) as s:
        r = await s.helper.run(["pwd"])
        assert r["stdout"].strip() == str(host.container_dir(CT))
    (tmp_path / "kh").write_text("")
    bad = options_for(host)
    bad.known_hosts = str(tmp_path / "kh")
    with pytest.raises(HostKeyRefused, match=host.host_fingerprint.replace("+", r"\+")):
        await Session(bad, place=Proxmox(CT), telemetry=False).start()


def test_nvidia_smi_lines_parse_and_join_by_uuid():
    out = (
        "0, GPU-3f2a9c1e-7b7d-4d8e-9f00-1a2b3c4d5e6f, NVIDIA H200, 97, 120345, 143771, 612.34, 64\n"
        "1, GPU-aaaa0000-1111-2222-3333-444455556666, NVIDIA H200, 0, 4, 143771, [N/A], 31\n"
        "Failed to initialize NVML: Driver/library version mismatch\n"
    )
    gpus = parse_output(out)
    assert gpus[0] == Gpu(
        0, "GPU-3f2a9c1e-7b7d-4d8e-9f00-1a2b3c4d5e6f", "NVIDIA H200", 97.0, 120345.0, 143771.0, 612.34, 64.0
    )
    assert gpus[1].power is None and gpus[1].util == 0.0 and len(gpus) == 2
    assert parse_gpu_line("index, uuid, name") is None
    thr = {
        "devices": [
            {
                "device": "cuda:1",
                "uuid": "GPU-aaaa0000-1111-2222-3333-444455556666",
                "role": "drafter",
                "tok_s": 5000.0,
            }
        ]
    }
    joined = join_devices(gpus, thr)
    assert joined[0][1] is None and joined[1][1]["role"] == "drafter"
    assert nvidia_smi_argv(250)[-2:] == [
        "-lms",
        "250",
    ] and "--format=csv,noheader,nounits" in nvidia_smi_argv(250)


def test_options_like_ssh():
    o = ConnectOptions.from_target("alice@gpu-box", user="bob", port=2222, identity_files=["~/k"])
    assert (o.user, o.host, o.display) == ("alice", "gpu-box", "alice@gpu-box:2222")
    kw = o.connect_kwargs()
    assert kw["username"] == "alice" and kw["port"] == 2222 and kw["client_keys"][0].endswith("/k")
    assert "known_hosts" not in kw  # default: ~/.ssh/known_hosts, checked
    assert "config" not in ConnectOptions("h").connect_kwargs()  # ~/.ssh/config applies
    assert _parse_jump("root@10.0.0.1:2200") == ("root", "10.0.0.1", 2200)
    assert _parse_jump("bastion") == (None, "bastion", None)
    assert set_flag(["--a", "1", "--resume", "x", "--resume=y"], "--resume", "auto") == [
        "--a",
        "1",
        "--resume",
        "auto",
    ]
    assert flag_value(["--output-dir=/r", "--x"], "--output-dir") == "/r"
    assert is_trainer_cmdline(["python3", "-u", "/root/train_dflash_pipeline.py", "--x"])
    assert is_trainer_cmdline(["/v/bin/python", "-m", "trainer.pipeline"])
    assert not is_trainer_cmdline(["pgrep", "-af", "train_dflash_pipeline.py"])
    assert not is_trainer_cmdline(["bash", "-lc", "python3 train_dflash_pipeline.py"])


async def test_a_trainer_that_ignores_sigint_is_refused_at_once_and_told_why(host):
    """Started with SIGINT ignored (``nohup ... &`` in a script), the script's KeyboardInterrupt never comes:
    the stop says so at once instead of signalling and waiting out its timeout, and names what else ends it."""
    p = start_user_script(host.container_dir(CT), "runs/i", ignore_sigint=True)
    run_dir = host.container_dir(CT) / "runs" / "i"
    try:
        async with Session(
            options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False, streams=False
        ) as s:
            phases: list[ActionPhase] = []
            res = await s.stop_trainer(timeout=60, on_phase=phases.append)
        assert res.code == Outcome.REFUSED, res
        assert [ph.phase for ph in phases] == ["verifying", "refused"]
        assert f"pid {p.pid} ignores SIGINT" in res.message and "nothing was signalled" in res.message
        assert f"kill -TERM {p.pid}" in res.message  # it does not ignore SIGTERM
        assert p.poll() is None and list(run_dir.iterdir()) == []  # still training, nothing saved
    finally:
        p.kill()
        p.wait()


async def test_stop_timeout_leaves_the_trainer_running_and_says_what_to_do(host):
    p = start_user_script(host.container_dir(CT), "runs/z")  # takes 0.4 s to "save" after SIGINT
    run_dir = str(host.container_dir(CT) / "runs" / "z")
    try:
        async with Session(
            options_for(host), place=Proxmox(CT), run_dir=run_dir, telemetry=False, streams=False
        ) as s:
            phases: list[ActionPhase] = []
            res = await s.stop_trainer(timeout=0.1, on_phase=phases.append)
            assert res.code == Outcome.STILL_RUNNING, res
            assert (
                phases[-1].phase == "timeout" and "left running" in res.message and "--timeout" in res.message
            )
            assert p.poll() is None  # not killed: nothing escalates
        assert p.wait(5) == 0  # and it finishes its save on its own
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_code_dir_is_the_folder_that_holds_the_trainer_package():
    """One name, one path (issue 34, item 5): an old run.json's ``code_dir`` (the package folder
    ``.../HASH/trainer``) is read as ``.../HASH``; PYTHONPATH then holds it once, not both."""
    from console.screens.launch_dialog import prefill

    code = "/root/.dflash-console/code/0123456789abcdef"
    run = {
        "argv": ["--output-dir", "/r"],
        "interpreter": "/usr/bin/python3",
        "output_dir": "/r",
        "code_dir": code + "/trainer",
        "env": {"PYTHONPATH": code, "OMP_NUM_THREADS": "1"},
    }
    plan = restart_plan(None, run)
    assert plan.code_dir == code and plan.env["PYTHONPATH"] == code
    assert f"code directory: {code} (run.json)" in plan.lines()
    assert prefill(run)[2] == code  # the launch dialog's prefill names the same folder
    other = restart_plan(None, run, code_dir="/srv/new")  # another code dir replaces both forms
    assert other.env["PYTHONPATH"] == "/srv/new" and other.code_given
    assert code_folder("/home/me/trainer") == "/home/me/trainer"  # a checkout may be named so


async def test_restart_refuses_what_only_run_json_vouches_for_unless_trusted(host, tmp_path):
    from tests.support.fake_code import other_code, run_json_for

    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "t"
    run_dir.mkdir(parents=True)
    code = other_code(tmp_path / "code")
    run_json_for(run_dir, ct_dir, code)
    async with Session(
        options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False, streams=False
    ) as s:
        plan, concerns, trainer = await s.plan_restart()
        assert trainer is None and plan.code_dir == code and len(concerns) == 1 and code in concerns[0]
        res = await s.restart_trainer(wait_s=30)  # nobody confirmed it
        assert res.code == Outcome.ERROR and "nothing was done" in res.message and code in res.message
        other = RestartPlan(**{**plan.__dict__, "flags": [*plan.flags, "--epochs", "9"]})
        res = await s.restart_trainer(wait_s=30, shown=other, trusted=concerns)  # not what was shown
        assert res.code == Outcome.ERROR and "changed after it was shown" in res.message
        assert not (run_dir / "RAN").exists()
        res = await s.restart_trainer(wait_s=30, shown=plan, trusted=concerns)
        assert res.code == Outcome.OK, res.message
    assert (run_dir / "RAN").exists()


async def test_a_checkouts_package_folder_is_read_as_the_checkout(host, tmp_path):
    """``--code-dir CHECKOUT/trainer`` (the package folder, as the dialog once prefilled) launches with
    CHECKOUT on PYTHONPATH; a checkout that is itself named ``trainer`` stays as it is."""
    from tests.support.trainer_run import ROOT

    named = tmp_path / "trainer"
    (named / "trainer").mkdir(parents=True)
    (named / "trainer" / "pipeline.py").write_text("")
    async with Session(options_for(host), place=Proxmox(CT), telemetry=False, streams=False) as s:
        helper = s.need_helper()
        assert await resolve_code_folder(helper, str(ROOT / "trainer")) == str(ROOT)
        assert await resolve_code_folder(helper, str(ROOT)) == str(ROOT)
        assert await resolve_code_folder(helper, str(named)) == str(named)
