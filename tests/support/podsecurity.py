"""The Pod Security Standards' "restricted" profile (with the "baseline" rules it includes),
checked on a pod spec as the admission controller at `enforce: restricted` would check it.

Written from the published standard (Kubernetes docs, "Pod Security Standards", policy
version 1.30), one function per control; each returns what it found wrong, as text naming the
field. `restricted_violations` runs them all; an empty list means the pod is admitted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["restricted_violations", "CONTROLS"]

Spec = dict[str, Any]

# Restricted: the one capability a container may add (baseline allows a dozen more).
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}
# Restricted: the only volume types allowed.
VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                "persistentVolumeClaim", "projected", "secret"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}


def _containers(spec: Spec) -> Iterator[tuple[str, Spec]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def _context(container: Spec) -> Spec:
    found: Spec = container.get("securityContext") or {}
    return found


def host_namespaces(spec: Spec, meta: Spec) -> list[str]:
    return [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]


def host_process(spec: Spec, meta: Spec) -> list[str]:
    found = []
    if (spec.get("securityContext") or {}).get("windowsOptions", {}).get("hostProcess"):
        found.append("spec.securityContext.windowsOptions.hostProcess")
    for where, c in _containers(spec):
        if _context(c).get("windowsOptions", {}).get("hostProcess"):
            found.append(f"{where}.securityContext.windowsOptions.hostProcess")
    return found


def privileged(spec: Spec, meta: Spec) -> list[str]:
    return [f"{where}.securityContext.privileged" for where, c in _containers(spec)
            if _context(c).get("privileged")]


def host_ports(spec: Spec, meta: Spec) -> list[str]:
    return [f"{where}.ports.hostPort={p['hostPort']}" for where, c in _containers(spec)
            for p in c.get("ports") or [] if p.get("hostPort")]


def apparmor(spec: Spec, meta: Spec) -> list[str]:
    found = []
    contexts = [("spec", spec.get("securityContext") or {})]
    contexts += [(where, _context(c)) for where, c in _containers(spec)]
    for where, context in contexts:
        kind = (context.get("appArmorProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{where}.securityContext.appArmorProfile.type={kind}")
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value == "runtime/default" or value.startswith("localhost/")):
            found.append(f"annotation {key}={value}")
    return found


def selinux(spec: Spec, meta: Spec) -> list[str]:
    found = []
    contexts = [("spec", spec.get("securityContext") or {})]
    contexts += [(where, _context(c)) for where, c in _containers(spec)]
    for where, context in contexts:
        options = context.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            found.append(f"{where}.securityContext.seLinuxOptions.type")
        found += [f"{where}.securityContext.seLinuxOptions.{k}" for k in ("user", "role")
                  if options.get(k)]
    return found


def proc_mount(spec: Spec, meta: Spec) -> list[str]:
    return [f"{where}.securityContext.procMount" for where, c in _containers(spec)
            if _context(c).get("procMount", "Default") != "Default"]


def sysctls(spec: Spec, meta: Spec) -> list[str]:
    return [f"spec.securityContext.sysctls: {s['name']}"
            for s in (spec.get("securityContext") or {}).get("sysctls") or []
            if s["name"] not in SAFE_SYSCTLS]


def volume_types(spec: Spec, meta: Spec) -> list[str]:
    """Restricted (it also covers baseline's hostPath rule)."""
    found = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            found.append(f"volume {volume.get('name')}: {sorted(kinds - VOLUME_TYPES)}")
    return found


def privilege_escalation(spec: Spec, meta: Spec) -> list[str]:
    return [f"{where}.securityContext.allowPrivilegeEscalation must be false"
            for where, c in _containers(spec)
            if _context(c).get("allowPrivilegeEscalation") is not False]


def run_as_non_root(spec: Spec, meta: Spec) -> list[str]:
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    found = []
    for where, c in _containers(spec):
        mine = _context(c).get("runAsNonRoot")
        if mine is False or (mine is None and pod is not True):
            found.append(f"{where}.securityContext.runAsNonRoot must be true (or the pod's)")
    return found


def run_as_user(spec: Spec, meta: Spec) -> list[str]:
    found = []
    if (spec.get("securityContext") or {}).get("runAsUser") == 0:
        found.append("spec.securityContext.runAsUser=0")
    found += [f"{where}.securityContext.runAsUser=0" for where, c in _containers(spec)
              if _context(c).get("runAsUser") == 0]
    return found


def seccomp(spec: Spec, meta: Spec) -> list[str]:
    """Restricted: RuntimeDefault or Localhost, on the pod or on every container, and no
    container Unconfined (baseline's rule)."""
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    found = []
    if pod is not None and pod not in SECCOMP_TYPES:
        found.append(f"spec.securityContext.seccompProfile.type={pod}")
    for where, c in _containers(spec):
        mine = (_context(c).get("seccompProfile") or {}).get("type")
        if mine is not None and mine not in SECCOMP_TYPES:
            found.append(f"{where}.securityContext.seccompProfile.type={mine}")
        elif mine is None and pod not in SECCOMP_TYPES:
            found.append(f"{where}: no seccompProfile (nor the pod's)")
    return found


def capabilities(spec: Spec, meta: Spec) -> list[str]:
    found = []
    for where, c in _containers(spec):
        caps = _context(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{where}.securityContext.capabilities.drop must include ALL")
        added = set(caps.get("add") or []) - RESTRICTED_CAPABILITIES
        if added:
            found.append(f"{where}.securityContext.capabilities.add {sorted(added)}")
    return found


CONTROLS: dict[str, Callable[[Spec, Spec], list[str]]] = {
    f.__name__: f for f in (host_namespaces, host_process, privileged, host_ports, apparmor,
                            selinux, proc_mount, sysctls, volume_types, privilege_escalation,
                            run_as_non_root, run_as_user, seccomp, capabilities)
}


def restricted_violations(spec: Spec, meta: Spec | None = None) -> list[str]:
    """What keeps the pod `spec` (with its template's `meta`: annotations) out of a namespace
    enforcing "restricted"; empty when it is admitted."""
    return [f"{name}: {v}" for name, check in CONTROLS.items() for v in check(spec, meta or {})]
