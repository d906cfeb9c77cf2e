"""The docs hold: every repository path README.md and docs/*.md name exists (or, named "at COMMIT", exists at that
commit), and every `jspec ...` / `python ...` command they show parses: its flags are accepted by the command's
own argparse, which is stopped right after parsing (no model is loaded or run)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("jspec/", "benchmarks/", "tools/", "tests/", "docs/", "checkpoints/")
SHA = re.compile(r"\b([0-9a-f]{7,40})\b")  # a commit a table row or paragraph names
FOREIGN = {"pip", "pytest", "nvidia-smi", "export", "bash", "cd", "git", "ray"}  # not jspec's commands


def _code(text: str):
    """(line, is in a fenced block) of a document's code: fenced lines and inline `spans`."""
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield line, True
        else:
            yield from ((span, False) for span in re.findall(r"`([^`]+)`", line))


def _blocks(text: str):
    """A document's table rows one by one, and its other paragraphs whole."""
    para = []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            yield line
        elif line.strip():
            para.append(line)
            continue
        if para:
            yield " ".join(para)
            para = []


def _paths(doc: Path):
    """(path named, the table row or paragraph naming it) for the repository paths a document names: in code or
    as a link; SHA:PATH (git show's) is the path at that commit."""
    for line in _blocks(doc.read_text()):
        names = re.findall(r"\]\(([^)#\s]+)", line) + [w for span in re.findall(r"`([^`]+)`", line)
                                                       for w in span.split()]
        for name in names:
            name = name.strip("'\",;:()")
            if "://" in name or "*" in name or "$" in name or "=" in name:
                continue
            if re.fullmatch(r"[0-9a-f]{7,40}:\S+", name):
                sha, name = name.split(":", 1)
                yield name, sha
            elif name.startswith(TOP) or re.fullmatch(r"[\w-]+\.(py|sh)", name) or name.endswith(".md"):
                yield name, line


def _exists(doc: Path, name: str, line: str) -> bool:
    """Whether name is in the tree, or (a script no longer there) at a commit the line names."""
    where = [ROOT / name, doc.parent / name, ROOT / "benchmarks" / name]
    if any(p.exists() for p in where):
        return True
    if "/" not in name and any(any((ROOT / top).rglob(name)) for top in TOP):  # a module named by its file
        return True
    for sha in SHA.findall(line):  # a script kept at the commit the line names
        for p in (name, f"benchmarks/{name}"):
            if subprocess.run(["git", "cat-file", "-e", f"{sha}:{p}"], cwd=ROOT, capture_output=True).returncode == 0:
                return True
    return False


def test_every_path_the_docs_name_exists():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: paths at a commit cannot be read")
    missing = [f"{doc.name}: {name}" for doc in DOCS for name, line in _paths(doc) if not _exists(doc, name, line)]
    assert not missing, missing


def _commands(doc: Path) -> list[list[str]]:
    """The argv of each jspec / python command a document shows (env assignments dropped, $(...) as a value)."""
    out = []
    for code, fenced in _code(doc.read_text()):
        code = re.sub(r"\$\([^)]*\)+", "VALUE", code)
        if "[--" in code or "|" in code.split("#")[0] and "--model DIR|" in code:
            continue  # a usage synopsis (jspec generate [PROMPT ...] [--model DIR|FILE.gguf] ...), not a command
        try:
            words = shlex.split(code, comments=True)
        except ValueError:
            continue
        for part in " ".join(shlex.quote(w) if w not in ("&&", ";", "|") else w for w in words).replace(
                ";", "&&").replace("|", "&&").split("&&"):
            try:
                argv = shlex.split(part)
            except ValueError:
                continue
            while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
                argv = argv[1:]
            named = argv[:1] == ["jspec"] and len(argv) <= 2 or argv[:2] == ["python", "-m"] and len(argv) <= 3
            if named and not fenced:
                continue  # a command named in prose (`jspec calibrate`), not run
            if argv and argv[0] in ("jspec", "python") and not (argv[0] == "python" and argv[1:2] == ["-c"]):
                if not (argv[:3] == ["python", "-m", "pytest"] or argv[:3] == ["python", "-m", "pip"]):
                    out.append(argv)
    return out


CHECK = r"""
import argparse, json, runpy, sys
RESULT = sys.argv[1]
class Parsed(BaseException):
    pass
parse = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_args
sys.path[:0] = [".", "benchmarks"]
out = []
for argv in json.loads(sys.stdin.read()):
    sys.argv = list(argv)
    try:
        if argv[:2] == ["jspec", "generate"]:  # its main: run() ends the process
            from jspec.cli import generate
            code = generate.main(argv[2:])
        elif argv[0] == "jspec":
            from jspec.cli import main
            code = main.main(argv[1:])
        elif argv[1] == "-m":
            sys.argv = argv[2:]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = "ran"
        else:
            sys.argv = argv[1:]
            runpy.run_path(argv[1], run_name="__main__")
            code = "ran"
    except Parsed:
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else str(e.code))
    except Exception as e:
        code = repr(e)
    out.append(code)
open(RESULT, "w").write(json.dumps(out))
"""


def test_every_command_the_docs_show_parses(tmp_path):
    commands = [(doc.name, argv) for doc in DOCS for argv in _commands(doc)]
    assert len(commands) > 10  # the README's and the docs' commands were found
    argvs = [argv for _, argv in commands]
    result = tmp_path / "codes.json"
    run = subprocess.run([sys.executable, "-c", CHECK, str(result)], input=json.dumps(argvs), cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                                                      "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert run.returncode == 0, run.stderr[-3000:]
    codes = json.loads(result.read_text())
    bad = [f"{doc}: {' '.join(argv)} -> {code}" for (doc, argv), code in zip(commands, codes) if code != 0]
    assert not bad, bad
