"""``overlapprof view``: TensorBoard on a run directory (or a folder of them)."""

from __future__ import annotations

import click

from overlapprof.cli.common import command, fail, note, unwind_on_sigterm

OFFLINE_NOTE = ("offline, the Scalars tab works (the overlap metrics per step and rank) and so does "
                "`overlapprof report` (one HTML file, nothing fetched); every view of the PyTorch Profiler tab "
                "(Overview, Operator, Trace, Distributed) stays blank: it loads Google Charts from the internet")


@command("view", epilog="Exit codes: 0 stopped with Ctrl-C or SIGTERM; 1 TensorBoard stopped on its own; 2 bad input "
                        "(one 'Error: ...' line on stderr).")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--port", type=click.IntRange(min=1, max=65535), default=6006, show_default=True,
              help="Port to serve on (127.0.0.1 only); when busy, a free one is picked.")
@click.option("--no-scalars", is_flag=True,
              help="Do not write the overlap scalars of run directories (and other folders of traces) that "
                   "lack them.")
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr (the URL is still printed).")
def view(path, port, no_scalars, quiet):
    """Start TensorBoard on PATH (a run directory or a folder of them), bound to 127.0.0.1, and
    print its URL; runs until Ctrl-C or SIGTERM, which stop TensorBoard and free its port.

    The PyTorch Profiler tab (torch-tb-profiler) shows each run's traces, one worker per rank,
    with a Distributed view for collectives; the Scalars tab shows the overlap metrics per step
    and rank (overlap/ratio, overlap/exposed_comm_us, ...), written into <run>/scalars/ first
    where missing (a folder of tensorboard_trace_handler traces gets <folder>/scalars/; one that
    cannot be analyzed is named, with the reason).
    """
    from overlapprof.renderers import view as tb_view

    tb_view.check_logdir(path)  # a bad path fails before anything starts
    unwind_on_sigterm()  # SIGTERM stops TensorBoard as Ctrl-C does, and frees its port
    note("starting TensorBoard", quiet)
    try:
        server = tb_view.start(path, port, scalars=not no_scalars, log=lambda line: note(line, quiet))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it starts: it was stopped
        return
    click.echo(f"TensorBoard: {server.url}/  (Ctrl-C to stop)")
    note(OFFLINE_NOTE, quiet)
    try:
        code = server.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated)
        server.stop()
        return
    if code:
        fail(f"TensorBoard stopped with code {code}: {server.log_tail(1)}", exit_code=1)
