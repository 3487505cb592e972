"""What the machine and its software are, as run.json records them: versions, the environment
variables that change communication, the CPU cores ranks can use (and a note when CPU ranks
outnumber them; OVERLAPPROF_PIN=1 pins each CPU rank to its own), and the device and backend the
flags come to here. Shared by ``overlapprof run``'s
launcher, its ``--link-rate`` check and ``overlapprof.profile``."""

import contextlib
import os
import platform

from overlapprof import __version__
from overlapprof.errors import LaunchError

_ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
              "OVERLAPPROF_PIN", "TORCH_DISTRIBUTED_DEBUG")
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "KINETO_")


def versions():
    """Versions of what produced the traces (null where absent)."""
    import torch
    import torch.distributed as dist

    found = {"python": platform.python_version(), "torch": str(torch.__version__),
             "overlapprof": __version__, "cuda": torch.version.cuda, "nccl": None, "gloo": None}
    if dist.is_nccl_available():
        with contextlib.suppress(Exception):  # a tuple (2, 21, 5); an int in old releases
            version = torch.cuda.nccl.version()
            found["nccl"] = (".".join(map(str, version)) if isinstance(version, tuple)
                             else str(version))
    if dist.is_gloo_available():
        found["gloo"] = f"bundled with torch {torch.__version__}"  # gloo has no version API
    return found


def relevant_env(environ=None):
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)}


def usable_cores() -> int:
    """CPU cores this process may use: its affinity mask (else os.cpu_count()), capped by a cgroup
    v2 CPU quota (``cpu.max``: quota/period, rounded up) when there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def oversubscription(nproc):
    """A note when CPU ranks outnumber this node's cores (ranks x OMP_NUM_THREADS > cores), else
    "": the ranks then time-share cores, so communication hidden under compute (a high overlap
    ratio) need not shorten the step, and step times are noisy."""
    cores = usable_cores()
    threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    if nproc * threads <= cores:
        return ""
    return (f"note: {nproc} ranks x {threads} thread(s) on {cores} CPU core(s): ranks time-share "
            "cores, so hidden communication cannot shorten steps much and step times are noisy")


def resolve_device(device, backend, nproc):
    """("cpu"|"cuda", "gloo"|"nccl") from the flags; raises LaunchError if impossible here."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus >= nproc else "cpu"
    if device == "cuda" and gpus == 0:
        raise LaunchError(f"--device cuda: no CUDA device is available (torch "
                          f"{torch.__version__})")
    if device == "cuda" and gpus < nproc:
        raise LaunchError(f"--device cuda with --nproc {nproc}: only {gpus} GPU(s) here; each "
                          "rank pins cuda:LOCAL_RANK")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise LaunchError("--backend nccl needs --device cuda")
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    if not available[backend]:
        raise LaunchError(f"--backend {backend}: not available in torch {torch.__version__}")
    return device, backend


PIN_ENV = "OVERLAPPROF_PIN"


def pin_rank(local_rank: int, local_ranks: int) -> list[int] | None:
    """With OVERLAPPROF_PIN=1, pin a CPU rank's threads (those it has and, by inheritance, those it
    starts later: gloo's, the profiler's) to its own share of the cores this process may use: local
    rank i of n on the i-th of n equal slices. Unpinned, the scheduler wakes a rank's main thread
    where its waker (a gloo thread) ran: on 2 cores, two ranks' main threads shared one core for
    182 of a run's 244 matmuls (a loaded machine), which doubles a step's compute; the likely
    cause of the all-reduce's step moving from 7 to 12-13 ms between idle runs. Off by default: on a
    machine others load, a pinned rank cannot move off a busy core. The cores it got, or None
    (nothing done) when ranks outnumber the cores (a core could idle while another had two ranks
    to run) or where affinity cannot be set."""
    if os.environ.get(PIN_ENV) != "1" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // max(1, local_ranks)
    if share < 1:
        return None
    mine = cpus[local_rank * share:(local_rank + 1) * share]
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), mine)
    return mine
