"""The current results pages: every committed page is what the raw runs give, and the rules a page
follows (which run a row shows, noise, the two attention efficiencies) hold on runs made here."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sweepbench.report.pages import main, render_all

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def test_committed_pages_are_what_the_raw_runs_give():
    files = render_all(RESULTS)
    assert files, "no page generated from docs/results/runs"
    for name, text in files.items():
        assert (RESULTS / name).is_file(), f"{name} is not committed: run python bench/pages.py"
        assert (RESULTS / name).read_text() == text, f"{name} differs from the raw runs: regenerate it"
    from sweepbench.benchmarks.registry import benchmark_names

    page = re.compile(rf"^({'|'.join(benchmark_names())})_[a-z0-9]+\.(md|csv)$")
    committed = {p.name for p in RESULTS.iterdir() if page.match(p.name)}
    assert committed == set(files), f"pages no raw run makes: {sorted(committed - set(files))}"


def test_attention_rows_take_t1_at_the_per_gpu_length_timed_the_same_way():
    """A row's T1(L/W) comes from a row of the same machine timed as it was: eager from eager, CUDA
    graphs from graphs (the runs before the knob count as eager)."""
    checked = 0
    for page in sorted(RESULTS.glob("attention_*.csv")):
        rows = list(csv.DictReader(page.open()))
        for r in rows:
            if not r["t1_local_run"]:
                continue
            seq = int(r["seq_len"]) // int(r["world_size"])
            sources = [s for s in rows if s["run"] == r["t1_local_run"] and int(s["seq_len"]) == seq
                       and s["kv_heads"] == r["kv_heads"] and s["model"] == r["model"]]
            assert sources and {s["cuda_graph"] for s in sources if s["t1_ms"] == r["t1_local_ms"]} == {r["cuda_graph"]}, r
            checked += 1
    assert checked, "no attention row takes T1 at the per-GPU length from another run"


def test_contract_columns_of_the_committed_pages():
    common = ["benchmark", "machine", "impl", "world_size", "iters", "median_ms", "iqr_ms", "date", "torch", "run"]
    own = {"attention": ["seq_len", "kv_heads", "t1_ms", "efficiency", "efficiency_local", "exposed_comm", "pattern",
                         "model"],
           "collective": ["op", "size_bytes", "busbw_gbps", "nccl_tests_busbw_gbps", "ratio"],
           "refit": ["model", "src", "dst", "mode", "floor_ms", "ratio_to_floor"],
           "reshard": ["suite", "case", "size_bytes", "floor_ms", "ratio_to_floor", "effective_gbps", "verified"],
           "train": ["model", "layout", "tokens_per_s_per_gpu", "mfu_pct"]}
    for bench, cols in own.items():
        pages = sorted(RESULTS.glob(f"{bench}_*.csv"))
        assert pages, bench
        for page in pages:
            header = next(csv.reader(page.open()))
            missing = [c for c in common + cols if c not in header]
            assert not missing, f"{page.name} lacks {missing}"


def _run(root: Path, name: str, rows: list[dict], sequence: int = 1, not_kept: str = "") -> None:
    d = root / "runs" / name
    d.mkdir(parents=True)
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (d / "command.txt").write_text(f"python -m sweepbench -m experiment=attention_llama3  # {name}\n")
    (d / "env.json").write_text(json.dumps({"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9",
                                            "cudnn": "91900", "driver": "580.1", "gpu": "NVIDIA H200"}))
    (d / "run.json").write_text(json.dumps({"sequence": sequence, **({"not_kept": not_kept} if not_kept else {})}))


def _att(impl: str, seq: int, w: int, iters: int, median: float, iqr: float, t1: float) -> dict:
    return {"benchmark": "attention", "impl": impl, "world_size": w, "model": "llama3_8b", "pattern": "dense",
            "heads": 32, "kv_heads": 8, "seq_len": seq, "iters": iters, "t1_iters": 10, "median_ms": median,
            "iqr_ms": iqr, "t1_ms": t1, "efficiency": t1 / (w * median), "exposed_comm": 0.01, "status": "ok"}


def test_gpu_state_columns_are_the_shown_runs_records():
    """A page row's gpu_sm_mhz_median and gpu_power_capped_pct are those of the job that measured it
    (its metrics.json gpu_state, kept in the raw run): filled where the job recorded them, empty where
    it did not (a CPU, or a run recorded before jobs kept them); the page says what they are."""
    filled = empty = 0
    for page in sorted(RESULTS.glob("*_*.csv")):
        for r in csv.DictReader(page.open()):
            if "gpu_sm_mhz_median" not in r or r["run"] == "":
                continue
            run = RESULTS / "runs" / r["run"]
            tags = {row.get("tag") or "" for row in csv.DictReader((run / "results.csv").open())
                    if row.get("median_ms") and float(row["median_ms"]) == float(r["median_ms"])}
            states = [json.loads((run / t / "metrics.json").read_text()).get("gpu_state") or {}
                      for t in tags if t and (run / t / "metrics.json").is_file()]
            want = {tuple("" if s.get(k) is None else str(s[k]) for k in ("gpu_sm_mhz_median", "gpu_power_capped_pct"))
                    for s in states}
            got = (r["gpu_sm_mhz_median"], r["gpu_power_capped_pct"])
            if got == ("", ""):
                empty += 1
                assert not want or ("", "") in want or not any(a for a, _ in want), (page.name, r["run"], want)
            else:
                filled += 1
                assert any(float(got[0]) == float(a) and float(got[1]) == float(b) for a, b in want if a), (
                    page.name, r["run"], got, want)
    assert filled and empty, (filled, empty)
    text = (RESULTS / "train_h200x1.md").read_text()
    assert "`gpu_sm_mhz_median`, `gpu_power_capped_pct`: how the GPUs ran" in text
    assert "| gpu_sm_mhz_median | gpu_power_capped_pct |" in text


def test_a_row_shows_the_latest_run_at_the_most_iterations_and_names_the_others(tmp_path):
    _run(tmp_path, "attention_h200x2_2026-01-01_fast", [_att("ring", 32768, 2, 5, 28.0, 0.2, 57.0),
                                                        _att("ring", 16384, 2, 5, 8.0, 0.1, 13.0)])
    _run(tmp_path, "attention_h200x2_2026-01-02_long", [_att("ring", 32768, 2, 20, 30.0, 0.3, 57.0),
                                                        _att("ulysses", 32768, 2, 20, 30.4, 0.3, 57.0)], 1)
    _run(tmp_path, "attention_h200x2_2026-01-02_long_2", [_att("ring", 32768, 2, 20, 30.1, 0.3, 57.0)], 2)
    files = render_all(tmp_path)
    rows = {(r["impl"], r["seq_len"]): r for r in csv.DictReader(files["attention_h200x2.csv"].splitlines())}
    ring = rows[("ring", "32768")]
    # the 5-iteration run is faster, and not shown: the most iterations, then the latest
    assert ring["run"] == "attention_h200x2_2026-01-02_long_2" and ring["median_ms"] == "30.1"
    assert "attention_h200x2_2026-01-01_fast: 28 ms at 5 iters (differs by more than the IQRs)" in ring["other_runs"]
    assert "attention_h200x2_2026-01-02_long: 30 ms at 20 iters (within noise)" in ring["other_runs"]
    # ulysses is 1% behind, inside the two IQRs
    assert rows[("ulysses", "32768")]["vs_fastest"].endswith("within noise")
    # efficiency_local: 2 * T1(16K) / T_2(32K), T1 at the per-GPU length from the run that measured 16K
    assert float(ring["t1_local_ms"]) == 13.0
    assert abs(float(ring["efficiency_local"]) - 2 * 13.0 / 30.1) < 1e-12
    assert abs(float(ring["efficiency"]) - 57.0 / (2 * 30.1)) < 1e-12
    assert rows[("ring", "16384")]["efficiency_local"] == ""  # no T1 at 8K on this machine: left empty
    assert ring["efficiency_target"] == "0.92" and ring["meets_target"] == "True"
    md = files["attention_h200x2.md"]
    assert "runs/attention_h200x2_2026-01-02_long_2/" in md and "torch 2.11.0+cu130" in md


def test_a_run_of_code_not_kept_yields_to_kept_runs_and_says_why(tmp_path):
    """A later run whose code was measured and then not kept: the earlier kept run's row is shown,
    the other one listed as not kept; a case only it measured is still shown; the page says why."""
    _run(tmp_path, "attention_h200x4_2026-01-01", [_att("ulysses", 16384, 4, 10, 4.7, 0.03, 12.8)])
    _run(tmp_path, "attention_h200x4_2026-01-02_packed", [_att("ulysses", 16384, 4, 10, 4.9, 0.03, 12.8),
                                                          _att("ulysses", 65536, 4, 10, 60.0, 0.3, 218.0)],
         not_kept="q, k and v packed in one message measured slower")
    files = render_all(tmp_path)
    rows = {r["seq_len"]: r for r in csv.DictReader(files["attention_h200x4.csv"].splitlines())}
    assert rows["16384"]["run"] == "attention_h200x4_2026-01-01" and rows["16384"]["median_ms"] == "4.7"
    assert rows["16384"]["other_runs"] == ("attention_h200x4_2026-01-02_packed: 4.9 ms at 10 iters "
                                           "(differs by more than the IQRs) (code not kept)")
    assert rows["65536"]["run"] == "attention_h200x4_2026-01-02_packed"
    md = files["attention_h200x4.md"]
    assert "Code not kept: q, k and v packed in one message measured slower" in md
    assert "gives a row only where" in md and "gives a row only where" not in render_all(RESULTS)["train_cpu.md"]


def test_check_fails_on_a_stale_page_and_bad_root_is_one_line(tmp_path, capsys):
    _run(tmp_path, "attention_h100x2_2026-01-01", [_att("ring", 16384, 2, 5, 8.0, 0.1, 13.0)])
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0
    page = tmp_path / "attention_h100x2.md"
    page.write_text(page.read_text().replace("8", "7"))
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert "attention_h100x2.md differs" in capsys.readouterr().out
    out = subprocess.run([sys.executable, "-m", "sweepbench.report.pages", "--root", str(tmp_path / "none")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no runs/ folder" in out.stderr


def test_the_index_links_every_page():
    index = (ROOT / "docs" / "results.md").read_text()
    pages = sorted(name for name in render_all(RESULTS) if name.endswith(".md"))
    missing = [p for p in pages if f"(results/{p})" not in index]
    assert not missing, f"docs/results.md does not link {missing}"
    for link in re.findall(r"\(results/([^)]+\.md)\)", index):
        assert (RESULTS / link).is_file(), f"docs/results.md links {link}, which is not there"


def test_a_finished_sweep_becomes_a_raw_run_and_its_page(report_sweeps, tmp_path, capsys):
    """The report tests' CPU sweeps (collective with a failed job, refit) kept with --add, then paged."""
    import torch

    (tmp_path / "runs").mkdir()
    coll, refit = report_sweeps["collective"], report_sweeps["refit"]
    name = "collective_cpu_2026-01-01_tiny"
    assert main(["--root", str(tmp_path), "--add", str(coll.sweep_dir), "--name", name]) == 0
    run = tmp_path / "runs" / name
    rows = list(csv.DictReader((run / "results.csv").open()))
    failed = [r for r in rows if r["status"] != "ok"]
    assert len(failed) == 1 and failed[0]["error"] and failed[0]["median_ms"] == ""
    ok = [r for r in rows if r["status"] == "ok"]
    tag = ok[0]["tag"]
    cases = {(c["op"], c["size_bytes"]): c for c in coll.metrics(tag)["results"]["cases"]}
    assert len(ok) == len(cases) and {r["op"] for r in ok} == {"all_reduce", "all_gather", "send_recv"}
    for r in ok:
        c = cases[(r["op"], int(r["size_bytes"]))]
        assert float(r["median_ms"]) == c["median_s"] * 1e3 and float(r["iqr_ms"]) == c["iqr_s"] * 1e3
        assert r["iters"] == "3" and r["world_size"] == "2"
    assert "benchmark=collective" in (run / "command.txt").read_text()
    assert json.loads((run / "env.json").read_text())["torch"] == torch.__version__
    assert (run / tag / "metrics.json").read_text() == (coll.sweep_dir / tag / "metrics.json").read_text()
    assert main(["--root", str(tmp_path), "--add", str(refit.sweep_dir), "--name", "refit_cpu_2026-01-01",
                 "--not-kept", "a trial"]) == 0
    # the second run kept for this machine and day, whatever its benchmark; its code marked as not kept
    assert json.loads((tmp_path / "runs" / "refit_cpu_2026-01-01" / "run.json").read_text()) == \
        {"sequence": 2, "not_kept": "a trial"}

    assert main(["--root", str(tmp_path)]) == 0
    page = list(csv.DictReader((tmp_path / "collective_cpu.csv").open()))
    assert len(page) == len(cases) and {r["run"] for r in page} == {name}  # the failed job: on no page
    [row] = list(csv.DictReader((tmp_path / "refit_cpu.csv").open()))
    assert float(row["ratio_to_floor"]) == float(row["median_ms"]) / float(row["floor_ms"])
    assert row["src"] == "tp2" and row["model"] == "tiny"  # the only run of its case: shown, not kept or not
    assert "Code not kept: a trial" in (tmp_path / "refit_cpu.md").read_text()

    capsys.readouterr()
    for bad in (["--name", "nonsense"], ["--name", name], ["--name", "nosuch_cpu_2026-01-01"]):
        assert main(["--root", str(tmp_path), "--add", str(coll.sweep_dir), *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("python bench/pages.py: "), err
    assert main(["--root", str(tmp_path), "--not-kept", "a trial"]) == 2  # a reason with no sweep to keep
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--not-kept" in err and "--add" in err, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [name, "refit_cpu_2026-01-01"]


def test_cudnn_version_written_as_people_do():
    from sweepbench.record.env import capture_env
    from sweepbench.report.pages import _cudnn

    assert (_cudnn(91900), _cudnn(8907), _cudnn(None)) == ("9.19.0", "8.9.7", "")
    assert "cudnn" in capture_env()  # recorded with every job (None without cuDNN)


def test_a_sweep_run_in_rounds_gives_a_row_per_job_and_keeps_every_round(compare_sweeps, tmp_path):
    """A job run in rounds (sweep.repeats) is one row, its combined record's; its rounds' records are
    kept beside it. Where not all its rounds ended ok, each round that did is a row."""
    base = compare_sweeps["base"]
    (tmp_path / "root" / "runs").mkdir(parents=True)
    assert main(["--root", str(tmp_path / "root"), "--add", str(base.sweep_dir), "--name", "refit_cpu_2026-01-01"]) == 0
    run = tmp_path / "root" / "runs" / "refit_cpu_2026-01-01"
    [row] = list(csv.DictReader((run / "results.csv").open()))
    tag = row["tag"]
    combined = base.metrics(tag)
    assert float(row["median_ms"]) == combined["results"]["cases"][0]["median_s"] * 1e3
    kept = sorted(p.relative_to(run).as_posix() for p in run.rglob("metrics.json"))
    assert kept == [f"{tag}/metrics.json", *(f"{tag}/rounds/{r}/metrics.json" for r in range(1, 6))]

    # the sweep stopped in its last round: the driver's combined record says so, and the page
    # keeps the four rounds that ended
    stopped = tmp_path / "stopped"
    shutil.copytree(base.sweep_dir, stopped)
    (stopped / tag / "rounds" / "5" / "metrics.json").unlink()
    record = json.loads((stopped / tag / "metrics.json").read_text())
    record.update(status="interrupted", error="round 5 of 5: interrupted by SIGTERM")
    (stopped / tag / "metrics.json").write_text(json.dumps(record))
    assert main(["--root", str(tmp_path / "root"), "--add", str(stopped), "--name", "refit_cpu_2026-01-01_2"]) == 0
    rows = list(csv.DictReader((tmp_path / "root" / "runs" / "refit_cpu_2026-01-01_2" / "results.csv").open()))
    rounds = [json.loads((stopped / tag / "rounds" / str(r) / "metrics.json").read_text()) for r in range(1, 5)]
    assert [float(r["median_ms"]) for r in rows] == [x["results"]["cases"][0]["median_s"] * 1e3 for x in rounds]
    assert {r["status"] for r in rows} == {"ok"} and {r["tag"] for r in rows} == {tag}
