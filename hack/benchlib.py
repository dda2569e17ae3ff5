"""What the make bench-* scripts share: a free loopback port, and a child's CPU time."""
import os
import socket


def free_port():
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(p):
    """Waits for the subprocess.Popen `p` (setting its returncode); its user + system CPU seconds."""
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime
