"""A corpus of bad configs, one mistake each: every one must be refused with the right key and message.

Each file's first line is ``# expect: <key path> | <substring of the message>``; key path ``-``
stands for an empty key (an error about the file as a whole).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from fusetune.config import load_config, parse_config
from fusetune.errors import ConfigError, FusetuneError

from conftest import SEEDS

CORPUS = Path(__file__).resolve().parent / "bad_configs"
FILES = sorted(CORPUS.glob("*.yaml"))
EXPECT = re.compile(r"^# expect: (?P<key>\S+) \| (?P<substring>.+?)\s*$")


def _expectation(path: Path) -> tuple[str, str]:
    first = path.read_bytes().decode("utf-8", errors="replace").splitlines()[0]  # not_utf8.yaml is not UTF-8
    match = EXPECT.match(first)
    assert match, f"{path.name}: first line must be '# expect: <key> | <substring>', got {first!r}"
    key = match["key"]
    return ("" if key == "-" else key), match["substring"]


def test_corpus_is_large_enough():
    assert len(FILES) >= 25


def test_every_corpus_file_declares_its_expectation():
    for path in FILES:
        _expectation(path)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_config_is_refused(path: Path):
    key, substring = _expectation(path)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert err.key == key, f"{path.name}: key {err.key!r}, expected {key!r} ({err})"
    assert str(path) in str(err)
    assert err.path == str(path)
    assert substring in str(err), f"{path.name}: {substring!r} not in {str(err)!r}"
    assert err.exit_code == 2
    assert isinstance(err, FusetuneError)


def test_message_layout_names_file_then_key():
    path = CORPUS / "epilogue_unknown_op_key.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: epilogue[0].epss: ")


def test_message_without_key_has_no_empty_key_segment():
    path = CORPUS / "not_yaml.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: not valid YAML")
    assert "line " in str(info.value)  # the YAML error position is passed on


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == ""
    assert str(path) in str(info.value)
    assert "cannot read" in str(info.value)


def test_shape_error_names_the_offending_shape_index():
    """An op that fits one shape but not another must say which shape broke it."""
    with pytest.raises(ConfigError) as info:
        load_config(CORPUS / "max_pool_larger_than_input.yaml")
    assert str(info.value).endswith("(for shapes[1])")  # 40 fits 126x126, not 35x43
    raw = yaml.safe_load(SEEDS["groupnorm"].read_text())
    raw["epilogue"][2]["kernel_size"] = 127  # larger than the first shape's 126x126 too
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "x.yaml")
    assert info.value.key == "epilogue[2].kernel_size"
    assert str(info.value).endswith("(for shapes[0])")
    raw["epilogue"][2]["kernel_size"] = 35  # fits both
    parse_config(raw, "x.yaml")


# --- Validation after a channel reduction, and module-safe names.

def _instancenorm_raw() -> dict:
    return copy.deepcopy(yaml.safe_load(SEEDS["instancenorm"].read_text()))


def test_pool_after_channel_reduction_is_a_config_error():
    raw = _instancenorm_raw()
    raw["epilogue"].append({"op": "max_pool", "kernel_size": 2})
    try:
        parse_config(raw, "x.yaml")
    except ConfigError as err:
        assert err.key == "epilogue[5].op"
    else:
        raise AssertionError("config with a pool after a channel reduction was accepted")


def test_per_channel_parameter_after_channel_reduction_is_a_config_error():
    raw = _instancenorm_raw()
    raw["epilogue"].append({"op": "mul", "by": "m"})
    try:
        parse_config(raw, "x.yaml")
    except ConfigError as err:
        assert err.key.startswith("epilogue[5]")
    else:
        raise AssertionError("config with mul-by-parameter after a channel reduction was accepted")


@pytest.mark.parametrize("name", ["café", "conv²"])
def test_non_ascii_name_is_refused(name):
    raw = _instancenorm_raw()
    raw["name"] = name
    try:
        parse_config(raw, "x.yaml")
    except ConfigError as err:
        assert err.key == "name"
    else:
        raise AssertionError(f"name {name!r} was accepted")
