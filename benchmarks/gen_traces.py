"""Write N ranks of M events each, Kineto-shaped, with a known overlap.

Every rank runs ``steps`` ProfilerSteps of identical 100-µs blocks. A block (times from its
start t0) holds, on the CPU, an ``aten::mm`` op launching a compute kernel and a
``record_param_comms`` op launching an NCCL all_reduce kernel, plus small filler ``aten::add`` ops;
on the GPU a compute kernel on stream 7 at [t0+5, t0+65) and the NCCL kernel on stream 20 at
[t0+5+d, t0+55+d), d = 40 + rank % 5. So per block comm is 50 µs, compute 60 µs, overlapped
20 − rank % 5 µs, and the overlap ratio of rank r is exactly (20 − r % 5) / 50 — in the whole
trace, per step, and with HolisticTraceAnalysis's filters alike.

    python benchmarks/gen_traces.py OUT_DIR --ranks 8 --events 200000 [--gzip]
    python benchmarks/gen_traces.py OUT_DIR --size 2000 [--gzip]     # one rank, ~2 GB of JSON

writes ``OUT_DIR/rank<r>.pt.trace.json[.gz]`` and ``OUT_DIR/expected.txt``: JSON of the answers
per rank (comm_us, compute_us, overlapped_us, overlap_ratio), not named ``.json`` so the folder
stays a folder of traces only.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

BLOCK_US = 100
FILLERS = 4  # aten::add ops per block
EVENTS_PER_BLOCK = 6 + FILLERS
BLOCKS_PER_STEP = 200
BASE_NS = 1_767_225_600 * 10**9  # 2026-01-01: an absolute clock, like recent Kineto traces
PID = 4242


def expected(rank: int, blocks: int) -> dict:
    """The analytic answer for a rank of ``blocks`` blocks."""
    overlap = 20 - rank % 5
    return {"comm_us": 50.0 * blocks, "compute_us": 60.0 * blocks, "overlapped_us": float(overlap * blocks),
            "overlap_ratio": overlap / 50}


def _x(cat, name, ts, dur, pid, tid, args):
    return (f'{{"ph":"X","cat":"{cat}","name":"{name}","pid":{pid},"tid":{tid},'
            f'"ts":{ts},"dur":{dur},"args":{{{args}}}}}')


def rank_events(rank: int, world: int, blocks: int):
    """Yield the JSON text of each event of one rank."""
    offset = 40 + rank % 5
    corr = 1
    t_start = 5_000_000_000 + rank * 3  # µs since BASE_NS; ranks a few µs apart
    gemm = "ampere_sgemm_128x64_nn"
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    ranks = "[" + ", ".join(map(str, range(world))) + "]"
    for b in range(blocks):
        t0 = t_start + b * BLOCK_US
        if b % BLOCKS_PER_STEP == 0:
            n = b // BLOCKS_PER_STEP
            span = min(BLOCKS_PER_STEP, blocks - b) * BLOCK_US
            yield _x("user_annotation", f"ProfilerStep#{n}", t0, span, PID, PID, f'"External id":{corr}')
        yield _x("cpu_op", "aten::mm", t0, 4, PID, PID, f'"External id":{corr},"Input Dims":[[512,512],[512,512]]')
        yield _x("cuda_runtime", "cudaLaunchKernel", t0 + 1, 2, PID, PID, f'"External id":{corr},"correlation":{corr}')
        yield _x("kernel", gemm, t0 + 5, 60, 0, 7,
                 f'"External id":{corr},"device":0,"stream":7,"correlation":{corr}')
        corr += 1
        yield _x("cpu_op", "record_param_comms", t0 + 6, 4, PID, PID,
                 f'"External id":{corr},"Collective name":"allreduce","Process Group Name":"0",'
                 f'"Process Group Ranks":"{ranks}","Group size":{world},"In msg nelems":65536,'
                 f'"Out msg nelems":65536,"dtype":"Float","Seq":{b}')
        yield _x("cuda_runtime", "cudaLaunchKernel", t0 + 7, 2, PID, PID, f'"External id":{corr},"correlation":{corr}')
        yield _x("kernel", nccl, t0 + 5 + offset, 50, 0, 20,
                 f'"External id":{corr},"device":0,"stream":20,"correlation":{corr}')
        corr += 1
        for k in range(FILLERS):
            yield _x("cpu_op", "aten::add", t0 + 20 + 10 * k, 3, PID, PID, f'"External id":{corr + 10**7 + k}')


def _gzip_open(path, mode):
    """ISA-L's gzip writer when installed (several times faster than zlib's on GBs), else gzip's."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.open(path, mode)
    return igzip.open(path, mode)


def write_rank(path: Path, rank: int, world: int, blocks: int, compress: bool) -> None:
    head = json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
                       "baseTimeNanoseconds": BASE_NS})[:-1]
    opener = _gzip_open if compress else open
    with opener(path, "wt") as f:
        f.write(head + ', "traceEvents": [')  # Kineto's layout: one event per "\n  {" line
        sep, batch = "\n  ", []
        for event in rank_events(rank, world, blocks):  # a batch at a time: GBs of text never in memory
            batch.append(event)
            if len(batch) == 10_000:
                f.write(sep + ",\n  ".join(batch))
                sep, batch = ",\n  ", []
        if batch:
            f.write(sep + ",\n  ".join(batch))
        f.write("\n]}\n")


def bytes_per_event(sample_blocks: int = 2000) -> float:
    """The average JSON text of an event as :func:`write_rank` writes it (separator included)."""
    events = list(rank_events(0, 1, sample_blocks))
    return sum(len(e) + 4 for e in events) / len(events)


def generate_size(out: Path, size: int, compress: bool = False) -> dict:
    """One rank of about ``size`` bytes of JSON text (before gzip): ``generate`` with the event
    count that makes it."""
    return generate(out, ranks=1, events=int(size / bytes_per_event()), compress=compress)


def generate(out: Path, ranks: int, events: int, compress: bool = False) -> dict:
    """Write the ranks and expected.json into ``out``; return the expected values."""
    out.mkdir(parents=True, exist_ok=True)
    blocks = max(1, events // EVENTS_PER_BLOCK)
    answers = {}
    for r in range(ranks):
        name = f"rank{r}.pt.trace.json" + (".gz" if compress else "")
        write_rank(out / name, r, ranks, blocks, compress)
        answers[str(r)] = expected(r, blocks)
    (out / "expected.txt").write_text(json.dumps({"blocks": blocks, "ranks": answers}, indent=1))
    return answers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--events", type=int, default=200_000, help="events per rank (about)")
    p.add_argument("--size", type=float, default=None, metavar="MB",
                   help="instead of --ranks/--events: one rank of about MB megabytes of JSON")
    p.add_argument("--gzip", action="store_true")
    a = p.parse_args(argv)
    if a.size:
        generate_size(a.out, int(a.size * 1e6), a.gzip)
        print(f"wrote one rank of ~{a.size:.0f} MB of JSON to {a.out}")
        return
    generate(a.out, a.ranks, a.events, a.gzip)
    print(f"wrote {a.ranks} ranks of ~{a.events} events to {a.out}")


if __name__ == "__main__":
    main()
