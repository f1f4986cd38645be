"""The lease Lua scripts: read from ``lease/lua/*.lua`` at import, registered per client."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["ACQUIRE", "RELEASE", "RENEW", "RENEW_MANY", "TOKEN_CHARS", "LeaseScripts"]

# Every lease token is this many hex characters (secrets.token_hex(TOKEN_CHARS // 2)):
# renew_many.lua finds each lease's token in one concatenated argument by this length.
TOKEN_CHARS = 32


def _load(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


ACQUIRE = _load("acquire")
RENEW = _load("renew")
RENEW_MANY = _load("renew_many")
RELEASE = _load("release")


class LeaseScripts:
    """The four lease scripts registered on one client with ``client.register_script``.

    Run them with ``run(script, keys, args)``: one EVALSHA, and if the server lost the script
    (restart, SCRIPT FLUSH) one SCRIPT LOAD and a second EVALSHA, exactly as ``Script.__call__``
    does, minus its per-call ``import`` (a few microseconds on every round trip).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.acquire = client.register_script(ACQUIRE)
        self.renew = client.register_script(RENEW)
        self.renew_many = client.register_script(RENEW_MANY)
        self.release = client.register_script(RELEASE)

    def run(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes | int]
    ) -> Any:
        """EVALSHA `script` with `keys` (every key it touches) and `args`; return its reply."""
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = self.client.script_load(script.script)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
