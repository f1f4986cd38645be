"""Run a command as a pod's container would, without a container engine: in a mount namespace
of its own where the root filesystem is read-only and only the pod's emptyDirs (fresh tmpfs
mounts) can be written, with no capability and no way to gain privileges (`no_new_privs`).

This is what `readOnlyRootFilesystem: true`, `capabilities: {drop: [ALL]}` and
`allowPrivilegeEscalation: false` leave a process; the network is the host's (the tests'
Redis and PostgreSQL answer on its loopback), and the user stays uid 0 without capabilities
(this machine's Python lives under /root, which no other user may read). Needs root and
util-linux's unshare, nsenter and setpriv, which CI has: a missing tool fails the test.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.support.workers import ROOT, Proc

__all__ = ["start", "run_inside", "NO_PRIVILEGES"]

# setpriv: clear every capability set and forbid gaining any back (execve of setuid files).
NO_PRIVILEGES = ["setpriv", "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all",
                 "--bounding-set=-all", "--"]


def _mounts_script(writable: Iterable[str]) -> str:
    """Shell commands that make / read-only and mount a tmpfs at every path of `writable`. A
    path whose directory does not exist gets it on a tmpfs over its parent (remounted read-only
    once the directory is made), as the kubelet makes a mount point."""
    checkout = shlex.quote(str(ROOT))
    # A checkout inside an emptyDir's path (a clone under /tmp) would vanish under its tmpfs:
    # a descriptor opened first keeps it, and it is bound back read-only at its place.
    lines = ["set -e", f"exec 9< {checkout}", "mount -o remount,bind,ro /"]
    for path in sorted(writable, key=lambda p: len(Path(p).parts)):
        target = shlex.quote(path)
        if not Path(path).is_dir():
            parent = shlex.quote(str(Path(path).parent))
            lines += [f"mount -t tmpfs -o size=1m tmpfs {parent}", f"mkdir -p {target}",
                      f"mount -t tmpfs -o size=64m tmpfs {target}",
                      f"mount -o remount,ro {parent}"]
        else:
            lines.append(f"mount -t tmpfs -o size=64m tmpfs {target}")
        if ROOT.is_relative_to(Path(path)):
            # --no-canonicalize: mount would resolve the descriptor's link to the path the
            # tmpfs now covers, and bind the empty directory onto itself.
            lines += [f"mkdir -p {checkout}",
                      f"mount --no-canonicalize --bind /proc/self/fd/9 {checkout}",
                      f"mount -o remount,bind,ro {checkout}"]
    return "; ".join(lines) + '; exec 9<&-; exec "$@"'


def start(argv: list[str], env: Mapping[str, str], writable: Iterable[str], name: str) -> Proc:
    """`argv` in a fresh sandbox (its pid is the command's own: every step execs the next)."""
    return Proc(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 _mounts_script(writable), "sandbox", *NO_PRIVILEGES, *argv], env, name)


def run_inside(proc: Proc, argv: list[str], env: Mapping[str, str],
               timeout: float) -> subprocess.CompletedProcess[str]:
    """`argv` in the mount namespace of the sandboxed `proc` (a probe: it sees the pod's
    emptyDirs), with the same lack of privileges."""
    return subprocess.run(["nsenter", f"--target={proc.pid}", "--mount", *NO_PRIVILEGES, *argv],
                          env=dict(env), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
