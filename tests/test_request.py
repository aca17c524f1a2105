"""A command line's variables become one frozen Request, read by doit's rule, that stages
ask for values and Shape records; bad input is one UserError line."""
from __future__ import annotations

import pytest
from doit import doit_cmd

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.models import Shape
from hslm_ptx.pipeline.core.request import VARIABLES, Request, current, given_variables, parse


def test_pairs_are_split_by_doits_rule():
    argv = ["doit", "-v", "2", "--db-file=x.db", "verify:k", "shape=smoke,tails", "backend=emulator", "shape=hslm"]
    assert given_variables(argv) == {"shape": "hslm", "backend": "emulator"}  # options and tasks are not variables


def test_a_value_may_hold_an_equals_sign():
    assert given_variables(["doit", "base=HEAD~1", "address=a=b"]) == {"base": "HEAD~1", "address": "a=b"}


def test_what_is_not_given_reads_as_the_default():
    request = parse(["doit", "verify"])
    assert request == Request()
    assert request.value("backend") == VARIABLES["backend"].default == config.DEFAULT_BACKEND
    assert request.value("shape", "hslm") == "hslm"
    assert not request.flag("force")


def test_a_given_value_wins_over_any_default():
    request = parse(["doit", "verify", "force=1", "shape=smoke"])
    assert request.value("shape", "hslm") == "smoke" and request.flag("force")


def test_a_request_is_frozen_and_in_table_order():
    request = parse(["doit", "shape=smoke", "backend=emulator", "force=1"])
    assert [name for name, _ in request.given] == [n for n in VARIABLES if n in ("shape", "backend", "force")]
    with pytest.raises(AttributeError):
        request.given = ()  # type: ignore[misc]


def test_sets_are_shape_records_from_shapes_yaml():
    sets = parse(["doit", "shape=smoke,tails,smoke"]).sets()
    assert list(sets) == ["smoke", "tails"]
    assert all(isinstance(shape, Shape) for shapes in sets.values() for shape in shapes)
    assert list(Request().sets()) == list(config.VERIFY_SETS)


def test_an_unknown_set_is_one_line():
    with pytest.raises(UserError) as info:
        parse(["doit", "shape=smok"]).sets()
    assert "unknown shape set 'smok'" in str(info.value) and "known:" in str(info.value)


def test_a_one_set_stage_refuses_a_list():
    assert parse(["doit", "bench"]).one_set("hslm") == "hslm"
    assert parse(["doit", "shape=smoke"]).one_set("hslm") == "smoke"
    with pytest.raises(UserError) as info:
        parse(["doit", "shape=smoke,tails"]).one_set("hslm")
    assert "this stage takes one set" in str(info.value)
    with pytest.raises(UserError):
        parse(["doit", "shape=nope"]).one_set("hslm")


def test_current_reads_what_doit_parsed(monkeypatch):
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {"shape": "smoke", "base": "HEAD~1", "other": "x"})
    assert current() == Request((("shape", "smoke"), ("base", "HEAD~1")))
    monkeypatch.setattr(doit_cmd, "_CMDLINE_VARS", {})
    assert current() == Request()
