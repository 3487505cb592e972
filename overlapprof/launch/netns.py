"""``overlapprof run --link-rate RATE``: an emulated network link for single-node CPU runs.

On CPU, gloo between ranks of one node talks over the loopback interface, which is a memory copy
done by the same cores that run the compute: hiding it under compute cannot shorten a step the
way hiding a transfer over a real interconnect can. With ``--link-rate``, the whole
``overlapprof run`` (launcher, rendezvous store and ranks) re-executes itself in a private user +
network namespace (what ``unshare -rn`` makes; no root needed where unprivileged user namespaces
are enabled) whose loopback is brought up and paced by a token-bucket qdisc::

    ip link set lo up
    tc qdisc add dev lo root tbf rate RATE burst BURST latency LATENCY

The filesystem, the working directory and the environment are shared, so run directories are
the same as a normal run's; only the network is private, and ``/etc/hosts``, which there also
names the IPv6 loopback ``localhost`` (:func:`_loopback_hosts` says why). ``tbf`` paces the
bytes leaving ``lo``: every rank's traffic goes through that one queue, so the link is a **shared medium** of RATE
(the total of all ranks' traffic), not a switch with a port of RATE per rank. It adds no
propagation latency (``netem`` would; this kernel has none, and nothing here depends on it), and
it does not model switches, NIC offload (the cores still copy every byte through the kernel's
TCP stack) or a per-rank port.

BURST must exceed the loopback MTU (64 KiB), or a full-size segment can never be sent; the
default (:func:`default_burst`) is half a millisecond of the link and at least two MTUs (128 KiB
up to 2gbit): a bucket of 1 MiB, refilled while the ranks compute, let a 4-rank ring's whole round
pass unpaced, so the link cost nothing to hide; LATENCY (``LATENCY_MS``) bounds how long a packet may queue before tbf drops it, so a
short one makes TCP drop and retransmit when 4 ranks send at once. See docs/running-workloads.md
for the values measured and why these were chosen.

Ctrl-C and exit codes go through the re-execution: the parent forwards SIGINT, SIGTERM and
SIGHUP to the child's process group (the launcher and its ranks, as a terminal's Ctrl-C would)
and exits with the child's exit code (128 + N when signal N killed it). No torch here. The link's
record in run.json, and its description in words, are :mod:`overlapprof.rundir.run_record`'s.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

from overlapprof.errors import LaunchError
from overlapprof.launch.host import resolve_device
from overlapprof.rundir.run_record import describe_link

ENV = "OVERLAPPROF_LINK"  # set in the re-executed run: the link (JSON) it runs over
LOOPBACK_MTU = 65536
BURST_MIN = 2 * LOOPBACK_MTU  # 128 KiB
BURST_TIME_S = 0.0005  # the default bucket holds half a millisecond of the link, at least BURST_MIN
LATENCY_MS = 100
MEDIUM = "one loopback shared by all ranks: RATE is their total, not a port per rank"
_IP_FAILED, _TC_FAILED = 11, 12  # exit codes of the setup script (unshare's own failures: 1)


def parse_rate(text):
    """Bits per second of a tc rate (``500mbit``, ``2gbit``, ``10gbit``; ``bps`` units are
    bytes per second, as in tc). Raises LaunchError (one line) when it does not parse."""
    from overlapprof.units import HELP, bits_per_s

    bits = bits_per_s(text)
    if bits is None:
        raise LaunchError(f"--link-rate {text!r}: not a rate; use {HELP}")
    return bits


def default_burst(bits_per_s):
    """tbf's default burst, bytes: ``max(BURST_MIN, bits_per_s / 8 * BURST_TIME_S)`` (half a
    millisecond of the link; 131072 at 1 and 2gbit, 625000 at 10gbit)."""
    return max(BURST_MIN, int(bits_per_s / 8 * BURST_TIME_S))


def link_for(rate, burst_bytes=None, latency_ms=None):
    """The link record of ``rate`` (what run.json's ``link`` holds, less ``qdisc``): tbf with
    ``burst_bytes`` (default :func:`default_burst`; must exceed the loopback MTU) and a queue of
    ``latency_ms`` (default LATENCY_MS). LaunchError (one line) for a rate that does not parse
    or a burst or latency tbf cannot use."""
    bits = parse_rate(rate)
    burst_bytes = default_burst(bits) if burst_bytes is None else int(burst_bytes)
    latency_ms = LATENCY_MS if latency_ms is None else latency_ms
    if burst_bytes <= LOOPBACK_MTU:
        raise LaunchError(f"--link-burst {burst_bytes}: must exceed the loopback MTU "
                          f"({LOOPBACK_MTU} bytes), or a full-size segment can never be sent")
    if not latency_ms > 0:
        raise LaunchError(f"--link-latency {latency_ms:g}: must be above 0 ms")
    return {"kind": "tbf", "interface": "lo", "rate": str(rate).strip().lower(),
            "bits_per_s": bits, "burst_bytes": burst_bytes, "latency_ms": latency_ms,
            "shared": True, "medium": MEDIUM}


def check_request(link, nnodes, device):
    """Refuse what an emulated loopback link cannot serve (LaunchError, one line)."""
    if nnodes > 1:
        raise LaunchError(f"--link-rate with --nnodes {nnodes}: the private network namespace "
                          "holds one node; emulate a link on a single node only")
    if device == "cuda":
        raise LaunchError("--link-rate with CUDA: NCCL does not talk over the loopback; use "
                          "--device cpu")


def inside():
    """The link this process runs over, when it is the re-executed run (else None)."""
    text = os.environ.get(ENV)
    return json.loads(text) if text else None


def _tools():
    tools = {name: shutil.which(name) for name in ("unshare", "ip", "tc", "mount")}  # mount: optional
    if not tools["unshare"]:
        raise LaunchError("--link-rate needs unshare(1) from util-linux, not found on PATH "
                          "(apt-get install util-linux)")
    missing = [name for name in ("ip", "tc") if not tools[name]]
    if missing:
        raise LaunchError(f"--link-rate needs {' and '.join(missing)} from iproute2, not found "
                          "on PATH (apt-get install iproute2; they live in /usr/sbin)")
    return tools


def _command(link, tools, then=(), hosts=None):
    """unshare + the setup script, then ``then`` (exec'd inside; nothing: only set up). With
    ``hosts`` (see :func:`_loopback_hosts`), the namespace has a mount namespace of its own too,
    where that file is bind-mounted on /etc/hosts (if the mount fails, the run goes on without)."""
    mount = hosts is not None  # _loopback_hosts gives one only where mount is found
    script = ((f"{tools['mount']} --bind {hosts} /etc/hosts 2>/dev/null; " if mount else "")
              + f"{tools['ip']} link set lo up || exit {_IP_FAILED}; "
              f"{tools['tc']} qdisc add dev lo root tbf rate {link['rate']} "
              f"burst {link['burst_bytes']} latency {link['latency_ms']:g}ms || exit {_TC_FAILED}; "
              + ('exec "$@"' if then else f"{tools['tc']} qdisc show dev lo"))
    return [tools["unshare"], "--user", "--map-root-user", "--net", *(["--mount"] if mount else []), "--",
            "/bin/sh", "-c", script, "sh", *then]


def _loopback_hosts(tools):
    """A temporary copy of /etc/hosts that also names the IPv6 loopback addresses ``localhost``;
    None where no mount namespace can be made. Why: c10d's store listens on both stacks, so a
    rank's connection comes from ``::ffff:127.0.0.1``, and c10d looks up its name. Outside, that
    lookup fails quietly; in the namespace there is no DNS server to ask, the resolver says "try
    again", and every rank printed "[c10d] The hostname of the client socket cannot be retrieved.
    err=-3"."""
    if not tools.get("mount"):
        return None
    try:
        if subprocess.run([tools["unshare"], "--user", "--map-root-user", "--net", "--mount", "--", "true"],
                          capture_output=True, timeout=30).returncode != 0:
            return None
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = "127.0.0.1 localhost\n"
    import tempfile

    fd, path = tempfile.mkstemp(prefix="overlapprof-hosts-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + "\n::1 localhost\n::ffff:127.0.0.1 localhost\n")
    return path


def probe(link):
    """Make the namespace and the qdisc once, before any rank starts; returns ``tc qdisc show``
    of the paced loopback. Raises LaunchError saying what is missing and how to get it."""
    tools = _tools()
    try:
        proc = subprocess.run(_command(link, tools), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"--link-rate: {tools['unshare']} did not run: {exc}") from None
    said = " ".join(proc.stderr.split())[:200]
    if proc.returncode == _TC_FAILED:
        raise LaunchError(f"--link-rate: tc could not add a tbf qdisc to lo in the namespace "
                          f"({said}); the kernel needs sch_tbf (CONFIG_NET_SCH_TBF, modprobe "
                          "sch_tbf)")
    if proc.returncode == _IP_FAILED:
        raise LaunchError(f"--link-rate: ip could not bring lo up in the namespace ({said})")
    if proc.returncode != 0:
        raise LaunchError(f"--link-rate: no private user+network namespace ({said}); enable "
                          "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1"
                          ", user.max_user_namespaces > 0; Ubuntu 24.04+: sysctl "
                          "kernel.apparmor_restrict_unprivileged_userns=0) or run as root")
    return proc.stdout.strip()


def reexec(link, argv):
    """Run ``python -m overlapprof ARGV`` in the namespace with ``link`` set up; returns the exit
    code to leave with. Signals to this process go to the child's process group."""
    tools = _tools()
    env = {**os.environ, ENV: json.dumps(link)}
    hosts = _loopback_hosts(tools)
    cmd = _command(link, tools, then=(sys.executable, "-m", "overlapprof", *argv), hosts=hosts)
    try:
        proc = subprocess.Popen(cmd, env=env, process_group=0)
    except OSError:
        _remove(hosts)
        raise

    def forward(signum, _frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    saved = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        _remove(hosts)  # (the mount holds the file for as long as the namespace lives)
    return 128 - code if code < 0 else code


def _remove(path):
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def qdisc_here():
    """``tc qdisc show dev lo`` in this process's namespace: the re-executed run checks that its
    loopback is paced and records the line in run.json. LaunchError when it is not paced."""
    tc = shutil.which("tc") or "tc"
    try:
        shown = subprocess.run([tc, "qdisc", "show", "dev", "lo"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        shown = ""
    if "tbf" not in shown:
        raise LaunchError(f"--link-rate: {ENV} is set but lo is not paced here ({shown!r}); "
                          f"unset {ENV}")
    return shown


def header_line(link, world_size):
    """The console line that names the link of a run."""
    return (f"link: {describe_link(link)} (tbf on lo in a private network namespace, burst "
            f"{link['burst_bytes'] // 1024} KiB, queue {link['latency_ms']:g} ms); one medium "
            f"shared by all {world_size} ranks, not a port per rank; no added latency")


def plain_loopback_note():
    return ("note: ranks talk over plain loopback: communication is a memory copy by the same "
            "cores that compute, so hiding it cannot shorten steps much; --link-rate RATE (e.g. "
            "2gbit) emulates a network link")


def prepare(request, rate, argv, burst_bytes=None, latency_ms=None):
    """The ``--link-rate`` hook of ``overlapprof run`` (``--link-burst``/``--link-latency``:
    tbf's burst and queue, see link_for): returns (link, exit code). Outside the
    namespace: checks everything (before any rank starts), re-executes ``overlapprof ARGV``
    inside it and returns (link, its exit code): the caller exits with that. Inside (the
    re-executed run): returns (link with its ``qdisc`` line, None), and the run goes on."""
    link = inside() or link_for(rate, burst_bytes, latency_ms)
    device, _ = resolve_device(request.device, request.backend, request.nproc)
    check_request(link, request.nnodes, device)
    if inside() is None:
        probe(link)
        return link, reexec(link, argv)
    return {**link, "qdisc": qdisc_here()}, None
