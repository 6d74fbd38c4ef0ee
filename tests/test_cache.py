"""The on-disk cache: keys, entries, corruption, atomic writes, concurrent writers, clearing."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import warnings

import pytest

from fusetune.cache import SCHEMA, Cache, Entry, atomic_write_bytes, atomic_write_text, make_key, usual_mode
from fusetune.config import load_config
from fusetune.search import Machine, key_fields

from conftest import SEEDS, run_processes

MACHINE = Machine("FakeGPU", "9.0", "13.0", "2.13")
FIELDS = {"problem": {"kind": "x"}, "shape": [1, 2, 3], "gpu": "FakeGPU"}


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# -- keys ---------------------------------------------------------------------------------------


def test_make_key_is_the_hash_of_canonical_json():
    fields = {"b": [1, 2], "a": {"y": 1, "x": "s"}}
    expected = hashlib.sha256(b'{"a":{"x":"s","y":1},"b":[1,2]}').hexdigest()[:24]
    assert make_key(fields) == expected
    assert len(expected) == 24 and int(expected, 16) >= 0


def test_make_key_is_order_independent():
    a = {"gpu": "G", "shape": [1, 2], "problem": {"p": 1, "q": [1, {"r": 2, "s": 3}]}}
    b = {"problem": {"q": [1, {"s": 3, "r": 2}], "p": 1}, "shape": [1, 2], "gpu": "G"}
    assert make_key(a) == make_key(b)
    assert make_key({"shape": (1, 2)}) == make_key({"shape": [1, 2]})  # tuples are lists


def test_make_key_of_real_fields_is_stable():
    spec = load_config(SEEDS["groupnorm"])
    one = make_key(key_fields(spec, spec.shapes[0], MACHINE, "abc"))
    two = make_key(key_fields(load_config(SEEDS["groupnorm"]), spec.shapes[0], Machine(*"FakeGPU 9.0 13.0 2.13".split()),
                              "abc"))
    assert one == two


@pytest.mark.parametrize("change", [
    "gpu", "torch", "cuda", "capability", "sources", "shape", "problem", "problem_param", "verification", "timing",
])
def test_make_key_changes_with_every_field(change, monkeypatch):
    spec = load_config(SEEDS["groupnorm"])
    other_spec = load_config(SEEDS["instancenorm"])
    machine, sources, shape = MACHINE, "abc", spec.shapes[0]
    base = make_key(key_fields(spec, shape, machine, sources))
    if change == "gpu":
        machine = Machine("OtherGPU", "9.0", "13.0", "2.13")
    elif change == "torch":
        machine = Machine("FakeGPU", "9.0", "13.0", "2.14")
    elif change == "cuda":
        machine = Machine("FakeGPU", "9.0", "12.8", "2.13")
    elif change == "capability":
        machine = Machine("FakeGPU", "8.0", "13.0", "2.13")
    elif change == "sources":
        sources = "abd"
    elif change == "shape":
        shape = spec.shapes[1]
    elif change == "problem":
        spec = other_spec
    elif change == "problem_param":  # same chain, one eps different
        import yaml

        from fusetune.config import parse_config
        raw = yaml.safe_load(SEEDS["groupnorm"].read_text())
        raw["epilogue"][0]["eps"] = 1e-6
        spec = parse_config(raw, str(SEEDS["groupnorm"]))
    elif change == "verification":  # a stricter verification: winners verified the old way are not trusted
        import fusetune.search
        monkeypatch.setattr(fusetune.search, "VERIFICATION", fusetune.search.VERIFICATION + 1)
    elif change == "timing":  # timed in a CUDA graph (optimize's): a winner there may lose when issued op by op
        import dataclasses
        spec = dataclasses.replace(spec, search=dataclasses.replace(spec.search, timing="graph"))
    assert make_key(key_fields(spec, shape, machine, sources)) != base


def test_key_ignores_the_name_and_search_settings():
    import yaml

    from fusetune.config import parse_config
    raw = yaml.safe_load(SEEDS["groupnorm"].read_text())
    spec = parse_config(raw, "a.yaml")
    raw.update(name="renamed", search={"trials": 3, "timeout": 5, "seed": 7, "timing": "launch"})
    renamed = parse_config(raw, "b.yaml")
    shape = spec.shapes[0]
    assert make_key(key_fields(spec, shape, MACHINE, "s")) == make_key(key_fields(renamed, shape, MACHINE, "s"))


# -- entries ----------------------------------------------------------------------------------


def test_record_load_round_trip(cache):
    assert cache.load("k1") is None
    first = cache.record("k1", FIELDS, "a=1", {"status": "ok", "time_ms": 1.5, "candidate": {"a": 1}})
    cache.record("k1", {"ignored": True}, "a=2", {"status": "crash", "log": "boom", "candidate": {"a": 2}})
    entry = cache.load("k1")
    assert isinstance(entry, Entry)
    assert entry.key == "k1"
    assert entry.fields == FIELDS  # the fields of the first write stay
    assert entry.outcomes == {"a=1": {"status": "ok", "time_ms": 1.5, "candidate": {"a": 1}},
                              "a=2": {"status": "crash", "log": "boom", "candidate": {"a": 2}}}
    assert entry.winner is None
    assert entry.updated >= first.updated > 0
    data = json.loads(cache.entry_path("k1").read_text())
    assert data["schema"] == SCHEMA and Entry.from_json(data) == entry
    assert entry.best_ok() == ("a=1", entry.outcomes["a=1"])
    assert cache.load("k2") is None


def test_record_overwrites_one_candidate(cache):
    cache.record("k", FIELDS, "a=1", {"status": "ok", "time_ms": 1.5})
    cache.record("k", FIELDS, "a=1", {"status": "timeout", "log": "slow"})
    assert cache.load("k").outcomes == {"a=1": {"status": "timeout", "log": "slow"}}


def test_record_rejects_unknown_status(cache):
    with pytest.raises(ValueError, match="unknown outcome status"):
        cache.record("k", FIELDS, "a=1", {"status": "fine"})
    assert not cache.entry_path("k").exists()


def test_best_ok_ignores_failures(cache):
    cache.record("k", FIELDS, "a", {"status": "wrong_result", "time_ms": 0.1})
    cache.record("k", FIELDS, "b", {"status": "ok", "time_ms": 3.0})
    cache.record("k", FIELDS, "c", {"status": "ok", "time_ms": 2.0})
    cache.record("k", FIELDS, "d", {"status": "infeasible"})
    assert cache.load("k").best_ok()[0] == "c"
    assert Entry(key="e", fields={}).best_ok() is None


def test_winner_is_kept_by_later_records(cache):
    winner = {"candidate": {"a": 1}, "time_ms": 1.5, "variant": {"s": {"a": 1}}}
    cache.record("k", FIELDS, "a=1", {"status": "ok", "time_ms": 1.5})

    def set_winner(e):
        e.winner = winner
    cache.update("k", FIELDS, set_winner)
    cache.record("k", FIELDS, "a=2", {"status": "ok", "time_ms": 9.0})
    entry = cache.load("k")
    assert entry.winner == winner
    assert set(entry.outcomes) == {"a=1", "a=2"}


# -- unreadable entries -----------------------------------------------------------------------

def _valid_text(cache) -> str:
    cache.record("k", FIELDS, "old", {"status": "ok", "time_ms": 1.0})
    return cache.entry_path("k").read_text()


CORRUPTIONS = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "garbage": lambda text: "\x00\x01 not json at all }{",
    "binary": lambda text: b"\xff\xfe\x00garbage",
    "wrong_schema": lambda text: json.dumps({**json.loads(text), "schema": SCHEMA + 1}),
    "no_schema": lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "schema"}),
    "missing_outcomes": lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "outcomes"}),
    "a_list": lambda text: "[1, 2, 3]",
    "bad_updated": lambda text: json.dumps({**json.loads(text), "updated": "yesterday"}),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_unreadable_entry_is_a_miss_with_a_warning_and_is_rewritten(cache, kind):
    text = _valid_text(cache)
    path = cache.entry_path("k")
    broken = CORRUPTIONS[kind](text)
    path.write_bytes(broken if isinstance(broken, bytes) else broken.encode())
    with pytest.warns(UserWarning, match="unreadable cache entry") as record:
        assert cache.load("k") is None
    assert str(path) in str(record[0].message)
    with pytest.warns(UserWarning, match="unreadable cache entry"):
        cache.record("k", FIELDS, "new", {"status": "ok", "time_ms": 2.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry = cache.load("k")
    assert entry is not None and entry.outcomes == {"new": {"status": "ok", "time_ms": 2.0}}
    assert json.loads(path.read_text())["schema"] == SCHEMA


def test_unreadable_entry_is_skipped_by_listing(cache):
    _valid_text(cache)
    cache.record("k2", FIELDS, "x", {"status": "ok", "time_ms": 1.0})
    cache.entry_path("k").write_text("{")
    with pytest.warns(UserWarning, match="unreadable cache entry"):
        assert [e.key for e in cache.entries()] == ["k2"]


# -- atomic writes ----------------------------------------------------------------------------


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "sub" / "file.json"
    for i in range(5):
        atomic_write_text(target, f"version {i}\n")
    assert target.read_text() == "version 4\n"
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["file.json"]


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "file.json"
    atomic_write_text(target, "old")
    with pytest.raises(TypeError):
        atomic_write_bytes(target, 12345)  # type: ignore[arg-type]  # fails mid-write, the temporary file open
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]


def test_records_leave_no_temp_files(cache):
    for i in range(10):
        cache.record("k", FIELDS, f"c{i}", {"status": "ok", "time_ms": float(i)})
    assert [f for f in _files(cache.root) if not f.startswith("locks/")] == ["entries/k.json"]


# -- concurrent writers -----------------------------------------------------------------------

WRITERS, PER_WRITER = 4, 25


def _writer(root: str, writer: int, barrier) -> None:
    cache = Cache(root)
    barrier.wait(timeout=60)
    for i in range(PER_WRITER):
        cache.record("shared", FIELDS, f"w{writer}-{i}", {"status": "ok", "time_ms": float(writer * 100 + i)})


def test_concurrent_writers_lose_nothing(tmp_path):
    root = tmp_path / "cache"
    Cache(root)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(str(root), w, barrier)) for w in range(WRITERS)]
    assert run_processes(procs, timeout=60) == [0] * WRITERS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no reader ever saw half a file
        entry = Cache(root).load("shared")
    assert len(entry.outcomes) == WRITERS * PER_WRITER
    assert entry.outcomes == {f"w{w}-{i}": {"status": "ok", "time_ms": float(w * 100 + i)}
                              for w in range(WRITERS) for i in range(PER_WRITER)}
    assert [f for f in _files(root) if not f.startswith("locks/")] == ["entries/shared.json"]


# -- clearing ---------------------------------------------------------------------------------


def _populate(cache, keys):
    for key in keys:
        cache.record(key, {**FIELDS, "problem_name": f"name-{key}"}, "c", {"status": "ok", "time_ms": 1.0})
        cache.study_path(key).write_text("journal\n")
    (cache.module_dir("m") / "kernels.cu").parent.mkdir(parents=True)
    (cache.module_dir("m") / "kernels.cu").write_text("//")
    cache.build_dir("m").mkdir(parents=True)


def test_clear_some_keys(cache):
    _populate(cache, ["k1", "k2", "k3"])
    assert cache.clear(["k1", "k3"]) == 2
    assert [e.key for e in cache.entries()] == ["k2"]
    assert not cache.study_path("k1").exists() and not cache.study_path("k3").exists()
    assert cache.study_path("k2").exists()
    assert (cache.module_dir("m") / "kernels.cu").exists()  # modules are shared: kept


def test_clear_everything(cache):
    _populate(cache, ["k1", "k2"])
    assert cache.clear() == 2
    assert cache.entries() == []
    assert [f for f in _files(cache.root) if not f.startswith("locks/")] == []
    for sub in ("entries", "studies", "modules", "builds", "locks"):
        assert (cache.root / sub).is_dir()
    cache.record("k1", FIELDS, "c", {"status": "ok", "time_ms": 1.0})  # still usable
    assert [e.key for e in cache.entries()] == ["k1"]


def test_find_by_prefix_or_name(cache):
    _populate(cache, ["abc1", "abd2"])
    assert [e.key for e in cache.find("ab")] == ["abc1", "abd2"]
    assert [e.key for e in cache.find("abc")] == ["abc1"]
    assert [e.key for e in cache.find("name-abd2")] == ["abd2"]
    assert cache.find("zzz") == []


def test_unusable_cache_dir_is_a_clear_error(tmp_path):
    from fusetune.errors import CacheError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="is not usable"):
        Cache(blocker)


def test_default_root(monkeypatch, tmp_path):
    from fusetune.cache import default_root

    monkeypatch.setenv("FUSETUNE_CACHE_DIR", str(tmp_path / "a"))
    assert default_root() == tmp_path / "a"
    monkeypatch.delenv("FUSETUNE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "fusetune"
    assert os.fspath(default_root()).endswith("fusetune")


# -- unreadable study journals --------------------------------------------------------------------

def test_cache_warning_is_a_user_warning(cache):
    from fusetune.cache import CacheWarning

    assert issubclass(CacheWarning, UserWarning)
    cache.entry_path("k").write_text("{")
    with pytest.warns(CacheWarning, match="unreadable cache entry"):
        assert cache.load("k") is None


@pytest.mark.parametrize("damage, keep", [
    ("truncated", 2),       # the last line cut mid-way
    ("garbage_line", 1),    # a line that is not JSON, then good ones: only the prefix before it is consistent
    ("binary", 0),
])
def test_repair_journal_keeps_the_readable_prefix(tmp_path, damage, keep):
    from fusetune.cache import CacheWarning, repair_journal

    lines = [json.dumps({"op_code": i, "n": "x" * 10}).encode() + b"\n" for i in range(3)]
    path = tmp_path / "s.journal"
    if damage == "truncated":
        data = b"".join(lines[:2]) + lines[2][:7]
    elif damage == "garbage_line":
        data = lines[0] + b"{not json\n" + lines[1] + lines[2]
    else:
        data = b"\xff\xfe\x00garbage"
    path.write_bytes(data)
    with pytest.warns(CacheWarning, match="study journal .* is unreadable"):
        assert repair_journal(path, settle_s=0.0) is True
    assert path.read_bytes() == b"".join(lines[:keep])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert repair_journal(path, settle_s=0.0) is False  # now readable: left alone
        assert repair_journal(tmp_path / "absent.journal") is False
    assert [p.name for p in tmp_path.iterdir()] == ["s.journal"]  # no temporary file left


def test_written_files_take_the_mode_a_plain_write_would(tmp_path):
    """mkstemp creates 0600, which a file renamed into place keeps: configs, cache entries and exports that a
    service account or a colleague could not read. A written file has the umask's mode, as open() gives."""
    mask = os.umask(0o022)
    os.umask(mask)
    path = tmp_path / "entry.json"
    atomic_write_text(path, "{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask == usual_mode()


def test_a_write_whose_check_fails_leaves_the_file_as_it_was(tmp_path):
    """``check`` reads the temporary file before the rename: what it raises leaves the old file, and no
    temporary file behind."""
    path = tmp_path / "config.yaml"
    atomic_write_text(path, "old\n")
    seen = []

    def refuse(tmp):
        seen.append(tmp.read_text())
        raise ValueError("no")
    with pytest.raises(ValueError):
        atomic_write_text(path, "new\n", check=refuse)
    assert seen == ["new\n"] and path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
