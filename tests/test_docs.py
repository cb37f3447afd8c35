"""The docs are tested: every command in README.md, DESIGN.md and docs/ must name a real module,
script or make target, only flags its `--help` lists, gin files that exist and gin bindings that
parse; every repository path in inline code must exist and every link between pages resolve.

Commands are read from ```bash fences and from inline code that starts like a command
(`python -m ...`, `make ...`, `scripts/...`). They assume the venv is active and the repository
root is the working directory, as the README says.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "DESIGN.md", *sorted((REPO / "docs").glob("**/*.md"))]

INTERPRETERS = {"python", "python3", ".venv/bin/python", ".venv-aot/bin/python"}
# CLIs that take the `--gin.KEY=VALUE` shorthand (t5x_like.gin_utils.split_gin_flags).
GIN_SHORTHAND = {"t5x_like.train", "t5x_like.infer", "t5x_like.evaluate", "t5x_like.plan",
                 "t5x_like.aot", "t5x_like.convert"}
# CLIs whose gin files and bindings are the trainer's, so they must parse as a training config.
GIN_PARSED = GIN_SHORTHAND - {"t5x_like.convert"}
TRAINER = "t5x_like.train"
_INLINE_COMMAND = re.compile(
    r"^(?:[A-Z_]+=\S+\s+)*(?:python3?\s|\.venv(?:-aot)?/bin/python\s|make\b|"
    r"(?:bash\s+|sbatch\s+(?:--\S+\s+)*)?scripts/\S+\.(?:sh|sbatch)\b)")
_REPO_PATH = re.compile(r"^(?:gin|scripts|t5x_like|tests|benchmarks|notebooks|docs)/[\w./{},-]*$")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*```(\w*)")
_PLACEHOLDER = re.compile(r"[*<]|(?<!\w)[A-Z]+(?!\w)")  # gin/runs/X.gin, DIR/..., *.gin


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command: where it is and its argv (interpreter and env stripped)."""

    where: str  # "docs/x.md:12"
    kind: str  # "module" | "script" | "shell" | "make"
    target: str  # module name, script path or make target
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {self.target} {' '.join(self.args)}"


# --- extraction ---------------------------------------------------------------------------

def _fenced_lines(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(line number, line, language of the enclosing fence or None outside fences)."""
    lang = None
    for i, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            lang = None if lang is not None else (m.group(1) or "text")
            continue
        yield i, line, lang


def _shell_commands(text: str) -> Iterator[tuple[int, str]]:
    """Commands of the ```bash / sh / shell fences: continuations joined, comments dropped."""
    pending, start = "", 0
    for i, line, lang in _fenced_lines(text):
        if lang not in ("bash", "sh", "shell"):
            continue
        if not pending:
            start = i
        pending += " " + line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        for part in _split_shell(pending):
            yield start, part
        pending = ""


def _split_shell(line: str) -> list[str]:
    """`line` cut at `&&`, `||`, `;` and `|` outside quotes, up to a `# comment`."""
    parts, current, quote, i = [], "", None, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (not current or current[-1].isspace()):
            break
        elif ch in ";|&":
            parts.append(current)
            current = ""
            i += 2 if line[i:i + 2] in ("&&", "||") else 1
            continue
        current += ch
        i += 1
    return [p.strip() for p in [*parts, current] if p.strip()]


def _inline_code(text: str) -> Iterator[tuple[int, str]]:
    """Inline code spans outside fences (spans may wrap lines), with their line numbers."""
    lines = {i: line for i, line, lang in _fenced_lines(text) if lang is None}
    prose = "\n".join(lines.get(i, "") for i in range(1, len(text.splitlines()) + 1))
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", prose):
        yield prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


def parse_command(where: str, command: str) -> Command | None:
    """A Command for a documented command line, or None if it is not one we check."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    while argv and re.match(r"^[A-Za-z_]+=", argv[0]):  # VAR=value prefixes
        argv.pop(0)
    argv = [a.lstrip("[") if a.startswith("[-") else a for a in argv]  # [--optional ...]
    argv = [a[:-1] if a.endswith("]") and "[" not in a else a for a in argv]
    if not argv:
        return None
    head, rest = argv[0], argv[1:]
    if head in INTERPRETERS:
        if len(rest) >= 2 and rest[0] == "-m":
            return Command(where, "module", rest[1], tuple(rest[2:]))
        if rest and rest[0].endswith(".py"):
            return Command(where, "script", rest[0], tuple(rest[1:]))
        return None
    if head == "make":
        targets = [a for a in rest if "=" not in a and not a.startswith("-")]
        return Command(where, "make", targets[0] if targets else "", ())
    if head in ("bash", "sbatch"):
        flags = [a for a in rest if not a.startswith("-")]
        rest = rest[rest.index(flags[0]):] if flags else []
        head, rest = (rest[0], rest[1:]) if rest else ("", [])
    if head.startswith("scripts/"):
        return Command(where, "shell", head, tuple(rest))
    return None


def extract_commands(name: str, text: str) -> list[Command]:
    """Every checkable command of one Markdown document."""
    found = [(i, c) for i, c in _shell_commands(text)]
    found += [(i, c) for i, c in _inline_code(text) if _INLINE_COMMAND.match(c)]
    commands = [parse_command(f"{name}:{i}", c) for i, c in found]
    return [c for c in commands if c is not None]


def flags(args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the command's own `--flags`, the flags after a bare `--`, which go to the trainer)."""
    own, forwarded = [], []
    target = own
    for a in args:
        if a == "--":
            target = forwarded
        elif a.startswith("--") and a != "--":
            target.append(a.split("=", 1)[0])
    return own, forwarded


def gin_files(args: tuple[str, ...]) -> list[str]:
    """gin files named by `--gin_file`, `--sweep` or as a bare `gin/...gin` argument."""
    out = []
    for i, a in enumerate(args):
        key, _, value = a.partition("=")
        if key in ("--gin_file", "--sweep") and not value and i + 1 < len(args):
            value = args[i + 1]
        if key in ("--gin_file", "--sweep"):
            out += [v for v in value.split(",") if v]
        elif a.startswith("gin/") and a.endswith(".gin"):
            out.append(a)
    return out


def gin_bindings(args: tuple[str, ...]) -> list[str]:
    return [a[len("--gin."):] for a in args if a.startswith("--gin.") and "=" in a]


def expand_braces(path: str) -> list[str]:
    """`a/{x,y}.gin` -> [`a/x.gin`, `a/y.gin`] (nested and repeated braces too)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",")
            for p in expand_braces(path[:m.start()] + alt + path[m.end():])]


# --- checks (pure: the help texts and the repository are passed in) ------------------------

def check_command(cmd: Command, help_of: Callable[[str], str], repo: Path,
                  make_targets: set[str]) -> list[str]:
    """What is wrong with one command (empty when nothing)."""
    problems = []
    if cmd.kind == "make":
        if cmd.target not in make_targets:
            problems.append(f"make target {cmd.target!r} is not in the Makefile")
        return problems
    if cmd.kind == "module":
        if not cmd.target.startswith("t5x_like"):
            return problems  # pip, pytest, ruff, venv: not ours
        if not module_exists(cmd.target, repo):
            return [f"no module {cmd.target}"]
    elif not (repo / cmd.target).is_file():
        return [f"no file {cmd.target}"]
    own, forwarded = flags(cmd.args)
    text = help_of(cmd.target)
    trainer = help_of(TRAINER) if cmd.kind == "shell" or forwarded else ""
    for flag in own:
        if flag.startswith("--gin."):
            if cmd.kind == "module" and cmd.target not in GIN_SHORTHAND:
                problems.append(f"{cmd.target} does not take --gin.KEY=VALUE bindings")
        elif not re.search(re.escape(flag) + r"(?![\w-])", text) and not (
                cmd.kind == "shell" and re.search(re.escape(flag) + r"(?![\w-])", trainer)):
            problems.append(f"flag {flag} is not in `{cmd.target} --help`")
    for flag in forwarded:
        if not flag.startswith("--gin.") and not re.search(re.escape(flag) + r"(?![\w-])",
                                                            trainer):
            problems.append(f"flag {flag} (after --) is not in `{TRAINER} --help`")
    for f in gin_files(cmd.args):
        if f.startswith("gin/") and not _PLACEHOLDER.search(f) and not (repo / f).is_file():
            problems.append(f"gin file {f} does not exist")
    return problems


def module_exists(module: str, repo: Path) -> bool:
    path = repo / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def check_paths(name: str, text: str, repo: Path) -> list[str]:
    """Repository paths in inline code that do not exist."""
    problems = []
    for line, span in _inline_code(text):
        span = span.split("::")[0].rstrip(":,.")
        if not _REPO_PATH.match(span) or _PLACEHOLDER.search(span):
            continue
        for path in expand_braces(span):
            if not (repo / path).exists():
                problems.append(f"{name}:{line}: path {path} does not exist")
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(line.lstrip("#")) for _, line, lang in _fenced_lines(text)
            if lang is None and re.match(r"^#{1,6} ", line)}


def check_links(doc: Path, text: str, read: Callable[[Path], str | None]) -> list[str]:
    """Relative links whose file or #anchor does not exist."""
    problems = []
    for i, line, lang in _fenced_lines(text):
        if lang is not None:
            continue
        for target in _LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.name}:{i}: link {target}"
            if path and not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(read(dest) or ""):
                problems.append(f"{where}: no heading #{anchor} in {dest.name}")
    return problems


# --- the help texts and gin parses (subprocesses, once per session) ------------------------

def _help(target: str) -> str:
    cmd = ([sys.executable, "-m", target] if not target.endswith((".py", ".sh", ".sbatch"))
           else [sys.executable, target] if target.endswith(".py") else None)
    if cmd is None:  # shell scripts: their flags are in their source
        return (REPO / target).read_text(encoding="utf-8")
    env = {**_env(), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    if done.returncode != 0:
        return f"<`{target} --help` failed: {done.stderr[-500:]}>"
    text = done.stdout
    usage = re.sub(r"-[\w-]+\s+\{[\w,]+\}", "", text.split("\n\n")[0])  # not an option's choices
    for sub in re.findall(r"\{([\w,]+)\}", usage):  # argparse sub-commands
        for name in sub.split(","):
            text += subprocess.run([*cmd, name, "--help"], capture_output=True, text=True,
                                   cwd=REPO, env=env, timeout=300).stdout
    return text


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}


_PARSE = """
import json, sys, gin
from t5x_like import gin_utils
errors = []
for files, bindings in json.load(sys.stdin):
    gin.clear_config()
    try:
        gin_utils.parse_gin(files, bindings)
        errors.append(None)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{type(e).__name__}: {e}")
print(json.dumps(errors))
"""


def parse_gin_configs(configs: list[tuple[list[str], list[str]]]) -> list[str | None]:
    """Each (gin files, bindings) parsed by the trainer's parser in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _PARSE], input=json.dumps(configs),
                          capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _all_commands() -> list[Command]:
    return [c for doc in DOCS
            for c in extract_commands(str(doc.relative_to(REPO)), doc.read_text("utf-8"))]


@functools.cache
def _help_texts() -> dict[str, str]:
    targets = {c.target for c in _all_commands() if c.kind != "make"
               and (c.kind != "module" or module_exists(c.target, REPO))}
    if any(c.kind == "shell" or "--" in c.args for c in _all_commands()):
        targets.add(TRAINER)
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(sorted(targets), pool.map(_help, sorted(targets)), strict=True))


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w.-]+):", text, re.M))


COMMANDS = _all_commands()


def test_docs_have_commands():
    """The extractor finds the documented commands (a broken extractor would check nothing)."""
    names = {c.target for c in COMMANDS}
    assert {"t5x_like.train", "t5x_like.infer", "t5x_like.evaluate", "pretrain", "test"} <= names


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command(cmd: Command):
    problems = check_command(cmd, _help_texts().__getitem__, REPO, _make_targets())
    assert not problems, f"{cmd}\n" + "\n".join(problems)


def test_gin_configs_parse():
    """Training-config commands: their gin files and bindings parse (generated files, such as a
    run's config.gin, are skipped)."""
    todo = []
    for cmd in COMMANDS:
        if cmd.kind != "module" or cmd.target not in GIN_PARSED:
            continue
        files = gin_files(cmd.args)
        if all((REPO / f).is_file() for f in files) and (files or gin_bindings(cmd.args)):
            todo.append((cmd, files, gin_bindings(cmd.args)))
    assert len(todo) >= 5, todo
    results = parse_gin_configs([(files, bindings) for _, files, bindings in todo])
    failed = [f"{cmd}\n  {err}" for (cmd, _, _), err in zip(todo, results, strict=True) if err]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_paths_and_links(doc: Path):
    text = doc.read_text(encoding="utf-8")
    problems = check_paths(str(doc.relative_to(REPO)), text, REPO)
    problems += check_links(doc, text, lambda p: p.read_text("utf-8") if p.is_file() else None)
    assert not problems, "\n".join(problems)


# --- the checker itself --------------------------------------------------------------------

_SAMPLE = """# Title

## Run it

```bash
python -m t5x_like.train --gin_file=gin/runs/quickstart.gin \\
    --model_dir=runs/x   # a comment --not_a_flag
make pretrain && make nope
```
Inline: `python -m t5x_like.infer --checkpoint=runs/x --beam_size=4` and a path
`gin/models/{tiny,missing}.gin`; a [link](#run-it), a [broken one](#walk-it).
"""


def test_checker_catches_renamed_flags_missing_files_and_broken_anchors(tmp_path):
    commands = extract_commands("sample.md", _SAMPLE)
    assert [(c.where, c.target) for c in commands] == [
        ("sample.md:6", "t5x_like.train"), ("sample.md:8", "pretrain"),
        ("sample.md:8", "nope"), ("sample.md:10", "t5x_like.infer")]
    assert commands[0].args == ("--gin_file=gin/runs/quickstart.gin", "--model_dir=runs/x")
    helps = {"t5x_like.train": "--gin_file --model_dir", "t5x_like.infer": "--checkpoint"}
    problems = [check_command(c, helps.__getitem__, REPO, {"pretrain"}) for c in commands]
    assert problems[0] == [] and problems[1] == []
    assert problems[2] == ["make target 'nope' is not in the Makefile"]
    assert problems[3] == ["flag --beam_size is not in `t5x_like.infer --help`"]
    assert check_paths("sample.md", _SAMPLE, REPO) == [
        "sample.md:11: path gin/models/missing.gin does not exist"]
    doc = tmp_path / "sample.md"
    doc.write_text(_SAMPLE)
    assert check_links(doc, _SAMPLE, lambda p: p.read_text()) == [
        "sample.md:11: link #walk-it: no heading #walk-it in sample.md"]
    bad_gin = Command("x.md:1", "module", "t5x_like.train", ("--gin_file=gin/runs/nope.gin",))
    assert check_command(bad_gin, lambda _: "--gin_file", REPO, set()) == [
        "gin file gin/runs/nope.gin does not exist"]


def test_gin_parse_reports_a_bad_binding():
    assert parse_gin_configs([([], ["train.batch_size=8"]), ([], ["train.batchsize=8"])])[0] \
        is None
    assert "batchsize" in parse_gin_configs([([], ["train.batchsize=8"])])[0]


def test_slug_matches_github():
    assert slug("Kernel API (`t5x_like.kernels.flash_attention`)") == \
        "kernel-api-t5x_likekernelsflash_attention"
    assert slug("Check before you rent: will it compile and fit?") == \
        "check-before-you-rent-will-it-compile-and-fit"
    assert expand_braces("a/{x,y}_{1,2}.gin") == ["a/x_1.gin", "a/x_2.gin", "a/y_1.gin",
                                                 "a/y_2.gin"]
