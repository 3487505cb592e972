"""Communication records (one per communication kernel or annotation) and logical operations.

:mod:`.fields` says which trace args a record keeps and how their values are coded;
:mod:`.recorder` reads them along with the events; :mod:`.table` builds a rank's table of
records (:class:`~.table.CommTable`); :mod:`.operations` merges the records of one host-side
call into logical operations (:class:`~.operations.CommOperations`), with their message sizes
(:mod:`.sizes`).
"""
