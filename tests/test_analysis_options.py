"""analyze()'s options (overlapprof/analysis/options.py): one definition, documented field by field."""

import ast
import dataclasses
from pathlib import Path

import pytest

import overlapprof
from overlapprof.analysis import options as options_module
from overlapprof.analysis.options import AnalyzeOptions
from overlapprof.errors import InputError
from overlapprof.report import Options

DATA = Path(__file__).parent / "data"


def test_every_field_has_a_docstring():
    (cls,) = [n for n in ast.parse(Path(options_module.__file__).read_text()).body
              if isinstance(n, ast.ClassDef) and n.name == "AnalyzeOptions"]
    body = cls.body
    fields = [(k, n.target.id) for k, n in enumerate(body) if isinstance(n, ast.AnnAssign)]
    assert [name for _, name in fields] == [f.name for f in dataclasses.fields(AnalyzeOptions)]
    undocumented = [name for k, name in fields
                    if not (k + 1 < len(body) and isinstance(body[k + 1], ast.Expr)
                            and isinstance(body[k + 1].value, ast.Constant) and isinstance(body[k + 1].value.value, str))]
    assert not undocumented, undocumented


def test_keywords_and_options_give_one_report():
    by_keywords = overlapprof.analyze(DATA / "negative_queue_length", workers=1, comms=False, drop_last_step=True)
    by_options = overlapprof.analyze(DATA / "negative_queue_length", AnalyzeOptions(comms=False, drop_last_step=True),
                                     workers=1)
    assert by_options == by_keywords
    assert by_options.options.drop_last_step and not by_options.options.crossrank
    with pytest.raises(TypeError, match="no_such_option"):
        overlapprof.analyze(DATA / "negative_queue_length", no_such_option=True)


def test_recorded_options_are_checked_and_normalized():
    recorded = AnalyzeOptions(comm_kernels="ncclKernel", like_hta=True, comm_ops=True, comms=False,
                              reference_bandwidth="2gbit", workers=3).recorded()
    assert recorded == Options(comm_kernels=["ncclKernel"], like_hta=True, drop_last_step=True, require_launch=True,
                               comm_records=True, crossrank=False, reference_bandwidth=2e9 / 8)
    with pytest.raises(InputError, match="not a valid regular expression"):
        AnalyzeOptions(comm_kernels=["("]).recorded()
    with pytest.raises(InputError, match="--reference-bandwidth 'fast': not a rate"):
        AnalyzeOptions(reference_bandwidth="fast").recorded()
    with pytest.raises(InputError, match="is not a backend name"):
        AnalyzeOptions(comm_backends=["a b"]).recorded()
