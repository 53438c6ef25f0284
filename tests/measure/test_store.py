"""The store of baselines (sweepbench/measure/store.py): entries read back with where and when they
were measured, refresh once per sweep run, the size cap evicting the oldest but never a held
entry, a hostile entry.json ignored with one line, concurrent jobs measuring a key once, and
``sweepbench store list|clear``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweepbench.measure.store import ENTRY_FILE, Store, StoreSettings, all_entries, default_dir

KIND = "test-baseline"


def _put(store: Store, n: int, *, nbytes: int = 0) -> Path:
    with store.entry(KIND, {"n": n}) as entry:
        files = {}
        if nbytes:
            tmp = entry.temp_file("blob")
            tmp.write_bytes(b"x" * nbytes)
            files["blob"] = tmp
        entry.put({"value": n}, files=files)
        return entry.where


def test_an_entry_is_read_back_with_where_and_when(tmp_path: Path) -> None:
    _put(Store(tmp_path, run="r1", job="/sweeps/a/job1"), 1)
    with Store(tmp_path, run="r2").entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") == 1
        assert entry.measured["job"] == "/sweeps/a/job1" and entry.measured["host"] and entry.measured["at"]
        assert entry.measured["store"] == str(tmp_path)
    with Store(tmp_path).entry(KIND, {"n": 2}) as entry:  # another key: nothing, and no folder left behind
        assert entry.value("value") is None and entry.measured is None
    assert [e["meta"]["key"] for e in all_entries(tmp_path)] == [{"n": 1}]


def test_refresh_measures_once_per_sweep_run(tmp_path: Path) -> None:
    _put(Store(tmp_path, run="old"), 1)
    refreshing = Store(tmp_path, refresh=True, run="new")
    with refreshing.entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") is None  # measured afresh...
        entry.put({"value": 10})
    with refreshing.entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") == 10  # ...once: the sweep's later jobs reuse it


def test_settings_name_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWEEPBENCH_STORE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "sweepbench" / "store" == StoreSettings().root()
    assert StoreSettings(dir="").root() is None and StoreSettings(enabled=False).root() is None
    assert StoreSettings(dir=str(tmp_path / "x")).root() == tmp_path / "x"
    monkeypatch.setenv("SWEEPBENCH_STORE_DIR", str(tmp_path / "y"))
    assert StoreSettings().root() == tmp_path / "y"


def test_the_cap_evicts_the_oldest_but_not_a_held_entry(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    big = Store(tmp_path)
    where = [_put(big, n, nbytes=400_000) for n in range(4)]
    for age, w in enumerate(where):  # entry 0 the oldest
        os.utime(w / ENTRY_FILE, (1_000_000 + age, 1_000_000 + age))
    capped = Store(tmp_path, max_mb=1.0)  # room for two
    with capped.entry(KIND, {"n": 0}):  # held by a job: not removed, the next oldest go instead
        removed = capped.evict()
    assert removed == [where[1], where[2]] and not where[1].exists() and where[0].exists() and where[3].exists()
    assert sum(e["bytes"] for e in all_entries(tmp_path)) <= 2**20
    assert capsys.readouterr().out.count("store.max_mb=1: removed") == 2
    newest = _put(capped, 9, nbytes=400_000)  # a write evicts, never the entry just written
    assert newest.exists() and not where[0].exists() and where[3].exists()


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"measured": "yes"}', b"[" * 100_000 + b"]" * 100_000,
                                     b"\xff\xfe binary"])
def test_a_hostile_entry_is_ignored_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  content: bytes) -> None:
    where = _put(Store(tmp_path), 1)
    (where / ENTRY_FILE).write_bytes(content)
    with Store(tmp_path).entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") is None
        entry.put({"value": 2})  # measured again, replaced
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sweepbench: ignoring store entry {where / ENTRY_FILE} (")
    with Store(tmp_path).entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") == 2


def test_an_entry_filed_under_another_key_or_not_a_file_is_ignored(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    where = _put(Store(tmp_path), 1)
    meta = json.loads((where / ENTRY_FILE).read_text())
    (where / ENTRY_FILE).write_text(json.dumps({**meta, "key": {"n": 2}}))
    with Store(tmp_path).entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") is None
    (where / ENTRY_FILE).unlink()
    os.mkfifo(where / ENTRY_FILE)  # reading it would wait forever
    with Store(tmp_path).entry(KIND, {"n": 1}) as entry:
        assert entry.value("value") is None
    out = capsys.readouterr().out
    assert "its key is not the one it is filed under" in out and "not a regular file" in out


CONCURRENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sweepbench.measure.store import Store
    store = Store(Path(sys.argv[1]), max_mb=0.001)  # every write evicts what it can
    with store.entry("k", {"same": True}) as entry:
        if entry.value("by") is None:
            time.sleep(0.3)  # measuring
            entry.put({"by": sys.argv[2]})
            print("measured")
        else:
            print("reused", entry.value("by"))
""")


def test_concurrent_jobs_measure_a_key_once(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(tmp_path), str(i)], stdout=subprocess.PIPE,
                              text=True) for i in range(4)]
    outs = [p.communicate(timeout=60)[0].split("\n")[-2] for p in procs]
    assert sorted(o.split()[0] for o in outs) == ["measured", "reused", "reused", "reused"], outs
    assert all(p.returncode == 0 for p in procs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweepbench", "store", *args], capture_output=True, text=True,
                          timeout=60)


def test_store_list_and_clear(tmp_path: Path) -> None:
    store = Store(tmp_path / "s", job="/sweeps/a/job1")
    _put(store, 1, nbytes=2048)
    bad = _put(store, 2)
    (bad / ENTRY_FILE).write_text("{torn")
    listed = _cli("list", "--dir", str(tmp_path / "s"))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3 and lines[-1].startswith(f"sweepbench store {tmp_path / 's'}: 2 entries, 2.")
    assert any(line.startswith(f"{KIND}  ") and " n=1  measured 20" in line and "by /sweeps/a/job1  2." in line
               for line in lines), lines
    assert any("unreadable or incomplete" in line for line in lines)
    cleared = _cli("clear", "--dir", str(tmp_path / "s"))
    assert cleared.returncode == 0 and "removed 2 entries" in cleared.stdout
    assert all_entries(tmp_path / "s") == []
    assert "sweepbench store list" in _cli("list", "--help").stdout and _cli("--help").returncode == 0
    (tmp_path / "f").write_text("")
    refused = _cli("list", "--dir", str(tmp_path / "f"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "is not a directory" in refused.stderr
