"""What would a change buy: a replay of the traced steps (issue 35).

:mod:`.timeline` reads the traced steps into lanes of keys and operations, :mod:`.engine`
replays them, :mod:`.transfer` fits the transfer-time model on the job's own operations,
:mod:`.changes` rewrites the traced steps for a change (``link_rate=4gbit``, ``compute=x0.5``, ...)
and :mod:`.predict` replays each change and says what limits the step. No torch.
"""
