#!/usr/bin/env python3
"""Types Ctrl-C into a command's terminal, as a user does: the command runs on a pseudo-terminal
(its controlling terminal, its process group the foreground one), and once WAIT_FOR appears in
its output the byte ^C is written to the terminal, so the kernel sends SIGINT to the foreground
process group.

    ctrl_c.py LOG WAIT_FOR COMMAND...
Writes the output to LOG; exits with the command's exit status (1 if WAIT_FOR never appeared, or
the command did not end within 120 s of the Ctrl-C, when its process group is killed)."""
import os
import pty
import select
import signal
import sys
import time

log, wait_for, command = sys.argv[1], sys.argv[2].encode(), sys.argv[3:]
pid, terminal = pty.fork()
if pid == 0:
    os.execvp(command[0], command)
output, sent, start = b"", None, time.time()
while time.time() - start < 300:
    ready, _, _ = select.select([terminal], [], [], 0.2)
    if ready:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # the command ended: the terminal is closed
            break
        if not chunk:
            break
        output += chunk
    if sent is None and wait_for in output:
        os.write(terminal, b"\x03")
        sent = time.time()
    if sent is not None and time.time() - sent > 120:
        os.killpg(pid, signal.SIGKILL)
        break
_, status = os.waitpid(pid, 0)
with open(log, "wb") as f:
    f.write(output)
if sent is None:
    sys.exit(1)
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
