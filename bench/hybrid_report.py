"""bench_hybrid.py's summary print: a line per step (rates, packed-vs-alone, the conv against its byte floor,
the per-layer accuracy table), then FP8 (block and row scales) against bf16."""

from __future__ import annotations


def print_summary(res: dict) -> None:
    print(f"\n{'step':22s} {'tok/s':>8s} {'TFLOP/s':>8s} {'%meas':>6s} {'1st s':>6s} {'peak GiB':>8s}")
    for name, e in res["steps"].items():
        if "tok_s" in e:
            print(
                f"{name:22s} {e['tok_s']:8.0f} {e['tflops']:8.1f} {100 * e.get('mfu_measured', 0):6.1f} "
                f"{e['first_call_s']:6.1f} {e.get('peak_mem_gib', 0):8.1f}"
            )
        elif "docs" in e:
            zero = sum(d["rel_err"] == 0.0 for d in e["docs"])
            print(
                f"{name:22s} {len(e['docs'])} docs ({zero} identical alone), max rel err {e.get('max_rel_err')}"
            )
        elif name == "conv":
            print_conv(e)
        elif name == "accuracy_fp32" and "lens" in e:
            print(
                f"{name:22s} rel err per layer, first 4 layers, packed row {e['lens']} (vs fp32; vs_bf16: vs bf16):"
            )
            for k, v in e.items():
                if isinstance(v, list) and k != "lens":
                    print(f"  {k:46s} {' '.join(f'{x:.2e}' for x in v)}")
        else:
            print(f"{name:22s} {str(e)[:100]}")
    h = res["steps"].get("hooks_single", {})
    if "direct_rel_err_by_layer" in h:
        print(
            "direct_single vs hooks_single, rel err by layer:",
            [f"{x:.1e}" for x in h["direct_rel_err_by_layer"]],
        )
    print_fp8(res.get("fp8_vs_bf16"), res.get("fp8row_vs_bf16"))
    print(f"total {res['total_s']:.0f} s", flush=True)


def print_fp8(block: dict | None, row: dict | None) -> None:
    """bf16, FP8 block and FP8 row tok/s in one line, each FP8 rate against bf16 and the goal; then each
    one's error per captured layer against bf16."""
    base = block or row
    if base is None:
        return
    rates = " / ".join(f"{v['fp8_tok_s']:,.0f}" if v else "-" for v in (block, row))
    ratios = ", ".join(
        f"{label} {v['fp8_over_bf16']:.3f}x ({'met' if v['goal_met'] else 'missed'})"
        for label, v in (("block", block), ("row", row))
        if v
    )
    print(
        f"bf16 / FP8 block / FP8 row packed: {base['bf16_tok_s']:,.0f} / {rates} tok/s; FP8 / bf16: {ratios} "
        f"(goal >= {base['goal_tok_s']:,} tok/s and >= {base['goal_ratio']}x)"
    )
    for label, v in (("block", block), ("row", row)):
        if v:
            errs = [f"{x:.1e}" for x in v["fp8_vs_bf16_rel_err_by_layer"] or []]
            print(f"FP8 {label} vs bf16 rel err by layer {errs}")


def print_conv(e: dict) -> None:
    if "floor_s_per_layer" not in e:
        print(f"{'conv':22s} {str(e)[:100]}")
        return
    line = (
        f"{'conv':22s} per layer: floor {1e3 * e['floor_s_per_layer']:.3f} ms "
        f"({e['copy_bandwidth_gb_s']:.0f} GB/s copy), reference {1e3 * e['reference_s_per_layer']:.3f} ms "
        f"= {e['reference_vs_floor']:.2f}x"
    )
    if "kernel_s_per_layer" in e:
        line += (
            f", kernel ({e.get('kernel', 'tile')}) {1e3 * e['kernel_s_per_layer']:.3f} ms = {e['kernel_vs_floor']:.2f}x "
            f"(goal <= 1.5x: {'met' if e['goal_met'] else 'missed'}; max rel err {e['max_rel_err']:.1e}); "
            f"per call {e['reference_s_per_call']:.4f} -> {e['kernel_s_per_call']:.4f} s"
        )
    else:
        line += f"; kernel {e.get('kernel')}"
    print(line)
    timed = [r for r in e.get("sweep", []) if "s_per_layer" in r]
    if timed:
        best = min(timed, key=lambda r: r["s_per_layer"])
        print(
            f"{'conv sweep best':22s} {best.get('kernel', 'tile')} {best['block_t']} x {best['block_c']}, {best['warps']} warps, "
            f"{best.get('stages', 0)} stages: {1e3 * best['s_per_layer']:.3f} ms = "
            f"{best['s_per_layer'] / e['floor_s_per_layer']:.2f}x the floor ({len(timed)} of {len(e['sweep'])} timed)"
        )
