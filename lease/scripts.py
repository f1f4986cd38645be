"""The lease Lua scripts, and the one script loader of the platform: `load_lua` reads a
package's ``lua/NAME.lua``, `run_script` runs a registered script (EVALSHA, and SCRIPT LOAD
once if the server lost it). The restock wing loads and runs its scripts with these too."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["load_lua", "run_script", "ACQUIRE", "RELEASE", "RENEW", "RENEW_MANY", "REVOKE",
           "TOKEN_CHARS", "LeaseScripts", "ms"]

# Every lease token is this many hex characters (secrets.token_hex(TOKEN_CHARS // 2)):
# renew_many.lua finds each lease's token in one concatenated argument by this length.
TOKEN_CHARS = 32


def ms(seconds: float) -> int:
    """A duration as the scripts' millisecond argument: whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))


def load_lua(package: str, name: str) -> str:
    """The text of `package`'s ``lua/{name}.lua``."""
    return (resources.files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def run_script(client: Any, script: Script, keys: Sequence[str | bytes],
               args: Sequence[str | bytes | int]) -> Any:
    """EVALSHA `script` with `keys` (every key it touches) and `args`; return its reply. If the
    server lost the script (restart, SCRIPT FLUSH): one SCRIPT LOAD and a second EVALSHA,
    exactly as ``Script.__call__`` does, minus its per-call ``import`` (a few microseconds on
    every round trip). On a RedisCluster client the EVALSHA goes to the master of the keys'
    slot (all of `keys` must share one) and SCRIPT LOAD to every master."""
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        script.sha = client.script_load(script.script)
        return client.evalsha(script.sha, len(keys), *keys, *args)


ACQUIRE = load_lua(__package__, "acquire")
RENEW = load_lua(__package__, "renew")
RENEW_MANY = load_lua(__package__, "renew_many")
RELEASE = load_lua(__package__, "release")
REVOKE = load_lua(__package__, "revoke")


class LeaseScripts:
    """The five lease scripts registered on one client with ``client.register_script``.

    Run them with ``run(script, keys, args)`` (`run_script` on this client).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.acquire = client.register_script(ACQUIRE)
        self.renew = client.register_script(RENEW)
        self.renew_many = client.register_script(RENEW_MANY)
        self.release = client.register_script(RELEASE)
        self.revoke = client.register_script(REVOKE)

    def run(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[str | bytes | int]
    ) -> Any:
        """EVALSHA `script` with `keys` (every key it touches) and `args`; return its reply."""
        return run_script(self.client, script, keys, args)
