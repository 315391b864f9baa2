"""A Kubernetes pod: ``kubectl exec -i [-n NAMESPACE] POD [-c CONTAINER] -- argv`` (``--pod
[NAMESPACE/]POD[:CONTAINER]``, ``pod = "..."``); kubeconfig and context as kubectl on the SSH host reads them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from console.core.places.base import Runtime, check_name


@dataclass(frozen=True)
class Kubernetes(Runtime):
    FLAG: ClassVar[str | None] = "--pod"
    KEY: ClassVar[str | None] = "pod"
    JSON: ClassVar[str | None] = "pod"
    TYPE: ClassVar[type] = str
    TOOL: ClassVar[str] = "kubectl"
    LABEL: ClassVar[str] = "pod"
    NOUN: ClassVar[str] = "pod"
    METAVAR: ClassVar[str] = "[NAMESPACE/]POD[:CONTAINER]"
    HELP: ClassVar[str] = "Kubernetes pod: run everything via `kubectl exec -i [-n NS] POD [-c CONTAINER] --`"

    name: str

    def __post_init__(self) -> None:
        self.check()
        ns, pod, container = self.parts
        check_name(str(self.KEY), "pod", pod)
        for what, part in (("namespace", ns), ("container", container)):
            if part:
                check_name(str(self.KEY), what, part)

    @property
    def value(self) -> str:
        return self.name

    @property
    def parts(self) -> tuple[str, str, str]:
        """(namespace or "", pod, container or "")."""
        ns, _, rest = self.name.rpartition("/")
        pod, _, container = rest.partition(":")
        return ns, pod, container

    def wrap(self, argv: list[str]) -> list[str]:
        ns, pod, container = self.parts
        pre = ["kubectl", "exec", "-i", *(["-n", ns] if ns else []), pod]
        return [*pre, *(["-c", container] if container else []), "--", *argv]
