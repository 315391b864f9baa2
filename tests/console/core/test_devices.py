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


def test_a_run_over_several_nodes_names_each_workers_node_and_one_node_names_none():
    """Workers of a two-node run send their node's name: CPU rows (or GPUs the console's nvidia-smi does not
    see) say which node they are on; a run on one node keeps the device name there."""
    from console.widgets.gpu_table import table_text

    cpu = [
        {"device": "cpu", "uuid": None, "role": r, "tok_s": 1.0, "busy": 0.5} for r in ("target", "drafter")
    ]
    two = [{**d, "host": f"node{i // 2 + 1}"} for i, d in enumerate(cpu + cpu)]
    st = ConsoleState(clock=lambda: T0)
    st.apply(Record(tp(T0, two)))
    assert [(r.role, r.host) for r in st.rows()] == [
        ("target", "node1"), ("drafter", "node1"), ("target", "node2"), ("drafter", "node2")
    ]  # fmt: skip
    assert "node2" in table_text(st.rows()).plain
    st.apply(Record(tp(T0 + 1, [{**d, "host": "vm"} for d in cpu])))
    assert [r.host for r in st.rows()] == [None, None] and "vm" not in table_text(st.rows()).plain
