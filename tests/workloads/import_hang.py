"""Test workload: blocks while it is imported (a module-level wait that never ends), so even the
launcher's check of the file, before any rank starts, never returns."""

import time

time.sleep(3600)

VARIANTS = {"sync": "never reached"}


def step(ctx, state):
    pass
