"""How a check's results are printed, by ``trainer.export --check`` and ``trainer.serve_check`` alike: one
line per problem, ``SERVER: error|warning: KEY: what``, then ``SERVER: ok`` (with its warnings counted) or
``SERVER: failed``; or one JSON object, ``{**head, "ok", "servers": {name: {"ok", "problems": [...]}}}``."""

from __future__ import annotations

import json

from trainer.exporting.problems import Problem, failed


def all_ok(results: dict[str, list[Problem]]) -> bool:
    return not any(failed(p) for p in results.values())


def text_lines(results: dict[str, list[Problem]]) -> list[str]:
    out = []
    for server, problems in results.items():
        out += [p.line(server) for p in problems]
        n_warn = sum(p.severity == "warning" for p in problems)
        tail = f" ({n_warn} warning{'s' if n_warn != 1 else ''})" if n_warn else ""
        out.append(f"{server}: {'failed' if failed(problems) else 'ok'}{tail}")
    return out


def json_text(results: dict[str, list[Problem]], **head: object) -> str:
    servers = {s: {"ok": not failed(p), "problems": [x.to_dict() for x in p]} for s, p in results.items()}
    return json.dumps({**head, "ok": all_ok(results), "servers": servers}, indent=1)


def print_results(results: dict[str, list[Problem]], as_json: bool, **head: object) -> int:
    """Print ``results``; the exit code: 0 when no server has an error, else 1."""
    print(json_text(results, **head) if as_json else "\n".join(text_lines(results)))
    return 0 if all_ok(results) else 1
