"""A real HTTP server on 127.0.0.1 (a free port) serving ``/metrics`` as a vLLM server exposes it, its
counters set by the test; for the served-acceptance tests (console/core/serving.py). ``mode`` makes it
hostile: ``redirect`` (302 elsewhere), ``trickle`` (a byte every second), ``huge`` (a body past the limit)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def vllm_body(
    drafts: float, accepted: float, per_pos: list[float], requests: float = 0, tokens: float = 0
) -> str:
    """Counters in vLLM's exposition (v1 engine: ``_total`` samples, ``_created`` gauges, labels)."""
    lab = 'engine="0",model_name="tiny"'
    lines = [
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.76e+09",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
            for i, v in enumerate(per_pos)
        ),
        f'vllm:request_success_total{{{lab},finished_reason="length"}} {requests}',
        f'vllm:request_success_total{{{lab},finished_reason="stop"}} 0.0',
        f"vllm:generation_tokens_total{{{lab}}} {tokens}",
        f"vllm:num_requests_running{{{lab}}} 1.0",
    ]
    return "\n".join(lines) + "\n"


class MetricsServer:
    def __init__(self, body: str = "", mode: str = "") -> None:
        self.body, self.mode, self.hits = body, mode, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                outer.hits += 1
                if outer.mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://metrics.invalid:9/metrics")
                    self.end_headers()
                    return
                data = (outer.body if outer.mode != "huge" else "x" * (5 << 20)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if outer.mode == "trickle":
                        for b in data[:60]:
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(1.0)
                        return
                    self.wfile.write(data)
                except OSError:  # the client gave up (a deadline, a size limit): that is the point
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
