"""What the make bench-* scripts share: a free loopback port, and a child's CPU time."""
import os
import random
import socket


def ephemeral_low():
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range (where the source
    ports of outgoing connections come from: one could take a port found free there before its
    listener binds it) and below Kubernetes' NodePort range (30000-32767)."""
    high = min(30000, ephemeral_low())
    for _ in range(200):
        port = random.SystemRandom().randrange(15000, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def cpu_seconds(p):
    """Waits for the subprocess.Popen `p` (setting its returncode); its user + system CPU seconds."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime
