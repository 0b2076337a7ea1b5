"""The emulator's sandbox store: the JSON the SDK's models validate.

Everything here runs on the emulator's event loop thread only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from poolkeeper_daytona.testing._toolbox import TOOLBOX_PREFIX

if TYPE_CHECKING:
    import random

__all__ = ["Sandbox", "SandboxStore"]

_LIST_ONLY_DROPPED = ("env", "kvm")
_DEFAULT_PAGE = 100


@dataclass(slots=True)
class Sandbox:
    """One emulated sandbox and the client that created it."""

    owner: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The sandbox's current state."""
        return str(self.data["state"])


class SandboxStore:
    """In-memory sandboxes, in creation order."""

    def __init__(self, rng: random.Random, base_url: str) -> None:
        """Create an empty store.

        Args:
            rng: Source of sandbox ids, so a seeded emulator is repeatable.
            base_url: The emulator's origin, used for ``toolboxProxyUrl``.
        """
        self._rng = rng
        self.base_url = base_url
        self._sandboxes: dict[str, Sandbox] = {}

    def create(self, owner: str, body: dict[str, Any]) -> Sandbox:
        """Store a new sandbox in state ``creating`` from a create body."""
        sandbox_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        labels = body.get("labels") or {}
        data: dict[str, Any] = {
            "id": sandbox_id,
            "organizationId": "emulator-org",
            "name": body.get("name") or sandbox_id,
            "snapshot": body.get("snapshot") or "daytona-default",
            "user": body.get("user") or "daytona",
            "env": body.get("env") or {},
            "labels": {str(k): str(v) for k, v in labels.items()},
            "public": bool(body.get("public")),
            "networkBlockAll": bool(body.get("networkBlockAll")),
            "kvm": bool(body.get("kvm")),
            "target": body.get("target") or "us",
            "cpu": 1,
            "gpu": 0,
            "memory": 1,
            "disk": 3,
            "state": "creating",
            "desiredState": "started",
            "toolboxProxyUrl": f"{self.base_url}{TOOLBOX_PREFIX}",
        }
        sandbox = Sandbox(owner=owner, data=data)
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def find(self, id_or_name: str) -> Sandbox | None:
        """Return the sandbox with that id or name, if any."""
        sandbox = self._sandboxes.get(id_or_name)
        if sandbox is not None:
            return sandbox
        for candidate in self._sandboxes.values():
            if candidate.data["name"] == id_or_name:
                return candidate
        return None

    def page(
        self,
        cursor: str | None,
        limit: int | None,
        labels: str | None,
        states: list[str],
    ) -> dict[str, Any]:
        """Return one ``{items, nextCursor}`` page of the matching sandboxes.

        Destroyed sandboxes are listed only when *states* asks for them.
        """
        wanted: dict[str, Any] = json.loads(labels) if labels else {}
        matches = [
            s
            for s in self._sandboxes.values()
            if (s.state in states if states else s.state != "destroyed")
            and all(s.data["labels"].get(k) == v for k, v in wanted.items())
        ]
        start = int(cursor) if cursor else 0
        size = limit or _DEFAULT_PAGE
        items = [
            {k: v for k, v in s.data.items() if k not in _LIST_ONLY_DROPPED}
            for s in matches[start : start + size]
        ]
        more = start + size < len(matches)
        return {
            "items": items,
            "nextCursor": str(start + size) if more else None,
        }

    def states(self) -> dict[str, str]:
        """Return every sandbox's state by id."""
        return {k: s.state for k, s in self._sandboxes.items()}
