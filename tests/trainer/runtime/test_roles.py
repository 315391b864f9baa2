"""The target role's micro-batch stream on CPU (``TargetRole.run``): in order, each handed on when computed."""

import time

import torch

from trainer.data.dataset import Plan, load_dir
from trainer.run.rundir import RoleMeter
from trainer.runtime.loop import quiet_transformers
from trainer.runtime.roles import TargetRole, launch_lock
from trainer.target.capture import load_target


def test_target_run_on_cpu_hands_each_batch_on_as_soon_as_it_is_computed(tiny_assets):
    quiet_transformers()
    model = load_target(str(tiny_assets / "target"), "cpu", torch.float32, [1, 3])
    plan = Plan(
        load_dir(str(tiny_assets / "data"), 256), seed=0, epochs=1, token_budget=1024, max_batch_size=4
    )
    meter = RoleMeter("cpu", "target")
    role = TargetRole(model, "cpu", [1, 3], False, meter)
    gs = list(range(min(plan.total, 4)))
    it = role.run(plan, gs)
    first = next(it)
    tokens, _ = meter.take(time.monotonic())
    assert first.index == 0 and tokens == first.tokens  # nothing computed ahead: on CPU there is no overlap
    rest = list(it)
    assert [hb.index for hb in rest] == gs[1:]
    ref = role(plan.batch(gs[-1]))
    assert torch.equal(rest[-1].hidden, ref.hidden)


def test_launch_lock_only_where_roles_compile():
    class Devices:
        def __init__(self, target, drafter):
            self.target, self.drafter = target, drafter

    assert (
        launch_lock(Devices(["cpu"], ["cpu"])) is None
    )  # CPU roles compute in the call: never serialise them
    lock = launch_lock(Devices(["cuda:0"], ["cuda:0"]))
    assert lock is not None and lock.acquire(blocking=False)
