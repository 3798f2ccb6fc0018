"""bench/ is a suite: few tracked files, no logs, and every headline figure's command names a
script that exists and that bench/README.md describes."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MAX_TRACKED = 42  # besides RESULTS.md (issue 50; issue 53's bench/fused_llama.py, issue 52's
# bench/train_step.py)
SCRIPT = re.compile(r"bench/[\w/.-]+?\.(?:py|sh)\b")


def tracked_bench_files() -> list[str]:
    """bench/'s tracked files, repository-relative; skips outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "ls-files", "bench"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"git ls-files failed: {done.stderr.strip()}")
    return done.stdout.split()


def headline_rows(results: str) -> list[list[str]]:
    """The cells of each row of the "Headline figures" table (header and rule left out)."""
    section = results.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["figure", "value", "command", "GPU", "date"], header
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def headline_scripts(results: str) -> list[list[str]]:
    """The bench scripts each headline row's command names."""
    return [SCRIPT.findall(row[2]) for row in headline_rows(results)]


def scripts_on_disk() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in BENCH.rglob("*")
                  if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts)


def test_bench_keeps_to_about_forty_tracked_files():
    files = [f for f in tracked_bench_files() if f != "bench/RESULTS.md"]
    assert len(files) <= MAX_TRACKED, f"{len(files)} tracked files in bench/: {files}"


def test_no_log_or_json_is_tracked():
    runs = [f for f in tracked_bench_files()
            if re.search(r"\.(log|json)(\.gz)?$", f) or f.startswith("bench/logs/")]
    assert not runs, f"run output tracked in bench/ (bench/.gitignore keeps it out): {runs}"


def test_the_gitignore_keeps_new_logs_out():
    ignore = (BENCH / ".gitignore").read_text().split()
    assert {"logs/", "*.log", "*.json"} <= set(ignore)


def test_every_headline_command_names_a_script_that_exists():
    results = (BENCH / "RESULTS.md").read_text()
    rows = headline_rows(results)
    assert len(rows) >= 10, "the headline table lost its rows"
    for row, scripts in zip(rows, headline_scripts(results)):
        assert len(row) == 5 and all(row), f"a headline row with an empty cell: {row}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[4]), f"not a date: {row[4]}"
        assert scripts, f"the command {row[2]!r} of {row[0]!r} names no bench script"
        missing = [s for s in scripts if not (ROOT / s).is_file()]
        assert not missing, f"{row[0]!r}: {missing} do not exist"


def test_the_readme_lists_every_script():
    readme = (BENCH / "README.md").read_text()
    missing = [s for s in scripts_on_disk() if f"`{s}`" not in readme]
    assert not missing, f"bench/README.md does not describe {missing}"


def test_the_readme_names_only_scripts_that_exist():
    readme = (BENCH / "README.md").read_text()
    gone = sorted({s for s in SCRIPT.findall(readme) if not (ROOT / s).is_file()})
    assert not gone, f"bench/README.md names scripts that do not exist: {gone}"


def test_the_checks_catch_what_they_look_for():
    """The parsers above on text that breaks each rule: a command naming no script, and one
    naming a deleted script, are both seen."""
    table = ("## Headline figures\n\n| figure | value | command | GPU | date |\n|---|---|---|---|---|\n"
             "| a | 1 | `python3 bench/gone_probe.py --x` | H200 | 2026-11-29 |\n"
             "| b | 2 | `kgen run x.kg` | H200 | 2026-11-29 |\n\n## Next\n| x | y |\n")
    assert headline_scripts(table) == [["bench/gone_probe.py"], []]
    assert not (ROOT / "bench/gone_probe.py").exists()
    assert SCRIPT.findall("bash bench/gpu_tests.sh; python3 bench/call_path.py") == [
        "bench/gpu_tests.sh", "bench/call_path.py"]
