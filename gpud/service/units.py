"""The systemd files of gpud, defined once: `gpud install-service` writes them, and the copies in
the repository's systemd/ folder are these texts rendered for `/opt/gpud` (a test keeps them equal;
regenerate with `python -m gpud.service.units systemd/`).
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_PREFIX = Path("/opt/gpud")
SOCKET = "/run/gpud/gpud.sock"

SERVICE = """\
# gpud: share the GPUs of this host between many Python processes.
# Installed by `gpud install-service` (README.md, "Running it as a service"). Clients reach the daemon
# through /run/gpud/gpud.sock (mode 0660, group gpud): add users to the gpud group to let them use the
# GPU. Settings: /etc/gpud/gpud.toml (read by default under systemd). Changes: `systemctl edit gpud`.
[Unit]
Description=gpud GPU daemon
Documentation={docs}
# nvidia-persistenced keeps the driver initialised; After= alone is harmless where it does not exist.
After=network.target systemd-udevd.service nvidia-persistenced.service gpud-nvidia-uvm.service
Wants=gpud-nvidia-uvm.service
# Restart=on-failure below, but not forever: 5 failed starts in 5 minutes leave it failed.
StartLimitIntervalSec=300
StartLimitBurst=5

[Service]
# READY=1 once every device is open and the socket bound; STATUS= shows devices, sessions, queued ops
# and health; WATCHDOG=1 only while pending GPU work completes (health_stall_s): a hung GPU stops the
# pings and systemd restarts the daemon. On SIGTERM it drains for drain_timeout_s (STOPPING=1).
Type=notify
NotifyAccess=main
WatchdogSec=30s
TimeoutStartSec=120s
TimeoutStopSec=60s
ExecStart={exec_start} serve
# A lost device (a sticky CUDA error) exits 3 and a hung one stops the watchdog: restart. A
# configuration error exits 2: restarting cannot fix it.
Restart=on-failure
RestartSec=2s
RestartPreventExitStatus=2
User=gpud
Group=gpud
UMask=0007
Environment=GPUD_ADDRESS=ipc://{socket}
RuntimeDirectory=gpud
RuntimeDirectoryMode=0750
StateDirectory=gpud
StateDirectoryMode=0700
CacheDirectory=gpud
CacheDirectoryMode=0700
# Compiled kernels (gpud's own cache) and the drivers' shader caches live in the cache directory,
# which survives restarts: the second start compiles nothing.
Environment=GPUD_CACHE_DIR=%C/gpud
Environment=XDG_CACHE_HOME=%C/gpud/xdg
Environment=MESA_SHADER_CACHE_DIR=%C/gpud/mesa
Environment=CUDA_CACHE_PATH=%C/gpud/cuda
Environment=__GL_SHADER_DISK_CACHE_PATH=%C/gpud/nvidia

# ---- hardening that still lets the GPU through (`systemd-analyze security gpud`: about 1.8, "OK")
NoNewPrivileges=yes
# NoNewPrivileges= makes the kernel ignore setuid bits: libcuda can no longer run the setuid
# nvidia-modprobe to load nvidia-uvm and create /dev/nvidia-uvm after a reboot. That is done before
# gpud starts by gpud-nvidia-uvm.service, a root oneshot (Wants= above). Not as
# `ExecStartPre=+/usr/bin/nvidia-modprobe -u -c=0` here: systemd builds this unit's device policy
# when the cgroup is set up, before ExecStartPre= runs, so a char-nvidia-uvm major that appears only
# then is never allowed, and DevicePolicy=closed forbids the mknod itself ("+" lifts User= and the
# namespaces, not the cgroup).
CapabilityBoundingSet=
AmbientCapabilities=
DevicePolicy=closed
# By /proc/devices group: nvidia0..N and nvidiactl (major 195: "nvidia", "nvidiactl", or
# "nvidia-frontend" with older drivers), nvidia-uvm and nvidia-uvm-tools, MIG capabilities, and
# /dev/dri/* for WebGPU through Vulkan. Groups missing on this host are skipped.
DeviceAllow=char-nvidia-frontend rw
DeviceAllow=char-nvidia rw
DeviceAllow=char-nvidiactl rw
DeviceAllow=char-nvidia-uvm rw
DeviceAllow=char-nvidia-caps rw
DeviceAllow=char-drm rw
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM
# AF_INET/AF_INET6: tcp:// and the metrics endpoint; AF_NETLINK: device discovery (udev).
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
# Not MemoryDenyWriteExecute=yes: wgpu-py calls into Python through cffi callbacks, which need
# writable and executable memory; the daemon fails to open a WebGPU device with it.
# Not PrivateDevices=yes: it would hide the GPU (DevicePolicy= above limits the devices instead).

[Install]
WantedBy=multi-user.target
"""

UVM_SERVICE = """\
# Installed with gpud.service (`gpud install-service`): load nvidia-uvm and create /dev/nvidia-uvm
# before gpud starts. gpud runs with NoNewPrivileges=yes, under which libcuda cannot do this itself
# through the setuid nvidia-modprobe (see gpud.service). Does nothing where nvidia-modprobe is absent.
[Unit]
Description=gpud: create /dev/nvidia-uvm (nvidia-modprobe -u)
ConditionPathExists=/usr/bin/nvidia-modprobe
After=systemd-udevd.service systemd-modules-load.service
Before=gpud.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=-/usr/bin/nvidia-modprobe -u -c=0
"""

SYSUSERS = """\
# gpud's user and group (sysusers.d(5)); members of group gpud may use the daemon's socket.
g gpud -
u gpud - "gpud GPU daemon" /var/lib/gpud /usr/sbin/nologin
# /dev/dri/* belong to video and render on Debian (WebGPU through Vulkan).
m gpud video
m gpud render
"""

TMPFILES = """\
# gpud's directories (tmpfiles.d(5)), for hosts that start gpud outside systemd too; the unit's
# RuntimeDirectory=, StateDirectory= and CacheDirectory= make the same.
d /run/gpud 0750 gpud gpud -
d /var/lib/gpud 0700 gpud gpud -
d /var/cache/gpud 0700 gpud gpud -
"""

# file name in systemd/ -> (where install-service puts it, relative to the root)
PLACES = {
    "gpud.service": "etc/systemd/system/gpud.service",
    "gpud-nvidia-uvm.service": "etc/systemd/system/gpud-nvidia-uvm.service",
    "gpud.sysusers": "etc/sysusers.d/gpud.conf",
    "gpud.tmpfiles": "etc/tmpfiles.d/gpud.conf",
}


def render(gpud_exec: Path | str, readme: Path | str | None = None) -> dict[str, str]:
    """Every file, by its name in systemd/, for a daemon started as `gpud_exec serve`."""
    text = str(gpud_exec)
    if any(c.isspace() for c in text) or "%" in text or not text.startswith("/"):
        raise ValueError(f"the gpud executable needs an absolute path without spaces or %: {text!r}")
    docs = f"file://{readme}" if readme is not None and " " not in str(readme) else "man:systemd.service(5)"
    return {
        "gpud.service": SERVICE.format(exec_start=text, socket=SOCKET, docs=docs),
        "gpud-nvidia-uvm.service": UVM_SERVICE,
        "gpud.sysusers": SYSUSERS,
        "gpud.tmpfiles": TMPFILES,
    }


def shipped() -> dict[str, str]:
    """What the repository's systemd/ folder holds: the files for a checkout at /opt/gpud, and the config."""
    from gpud.service.config_example import render_defaults

    units = render(DEFAULT_PREFIX / ".venv" / "bin" / "gpud", DEFAULT_PREFIX / "README.md")
    return {**units, "gpud.toml": render_defaults()}


if __name__ == "__main__":  # python -m gpud.service.units systemd/
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "systemd")
    for name, content in shipped().items():
        (folder / name).write_text(content)
        print(f"wrote {folder / name}")
