"""One GPU <-> trainer-device join (console/core/devices.py) for ``status`` and the screen."""

from console.core.events import GpuSample, Record, TrainerFound, TrainerInfo
from console.core.state import ConsoleState
from console.core.status import gpu_entries
from tests.support.records import T0, dev, gpus, tp


def test_status_and_screen_join_through_cuda_visible_devices_alike():
    # A trainer on GPUs 2 and 3 (CUDA_VISIBLE_DEVICES=2,3) whose throughput devices carry no uuid:
    # a uuid-only join (what `status` did) finds no role at all; the screen joined cuda:0 -> GPU 2.
    sample = gpus(4)
    run = {"env": {"CUDA_VISIBLE_DEVICES": "2,3"}}
    thr = tp(T0, [dev(0, "target", 900.0, uuid=False), dev(1, "drafter", 300.0, uuid=False)])

    st = ConsoleState(clock=lambda: T0)
    st.apply(TrainerFound(TrainerInfo(1, 1, ["python3"], "/r", "run.json", run)))
    st.apply(GpuSample(sample.gpus))
    st.apply(Record(thr))
    screen = {r.label: r.role for r in st.rows()}
    status = {str(g["index"]): g["role"] for g in gpu_entries(sample.gpus, thr, run)}

    assert status == screen == {"0": None, "1": None, "2": "target", "3": "drafter"}
    by_index = {g["index"]: g for g in gpu_entries(sample.gpus, thr, run)}
    assert by_index[2]["device"] == "cuda:0" and by_index[3]["tok_s"] == 300.0
