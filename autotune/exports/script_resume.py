"""Whether a script resumes from what it is given, read from its source (pure; never run; no torch): a value (a
flag's attribute, a config key, an environment variable, a function's parameter) shown to flow into a call that
loads a checkpoint, and whether that call loads a file or a directory.

The flow is followed through assignments, ``with ... as``, ``for`` targets and the script's own functions' parameters
(``def load(path): torch.load(path)`` called with the flag), in the script and the modules of its own project. A path
the script looks inside (``os.path.join(x, ...)``, ``Path(x) / ...``, ``x.glob(...)``, ``os.listdir(x)``) is a
directory whatever the call then loads. The calls: ``torch.load``, Fabric's ``load``, safetensors' ``load_file``,
``load_checkpoint`` (DeepSpeed's takes a directory), Accelerate's ``load_state`` (a directory), DCP's ``load``
(``checkpoint_id``, a directory), Lightning's ``load_from_checkpoint`` and ``ckpt_path=`` (a file), the HF
Trainer's ``resume_from_checkpoint=`` (a directory). A flag whose help says it resumes is documented as resume (its
form not known from it). Nothing is guessed from a name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from autotune.exports.script_syntax import call_name
from autotune.rundir.layout import RESUME_FROM_ENV

# a load call (the last part of its name) -> the form of what it loads ("either": a file or a directory)
LOAD_CALLS = {"load": "file", "load_file": "file", "load_checkpoint": "either", "load_state": "directory",
              "load_from_checkpoint": "file"}
LOAD_KEYWORDS = {"resume_from_checkpoint": "directory", "ckpt_path": "file", "checkpoint_id": "directory"}
DIRECTORY_READERS = ("FileSystemReader",)  # DCP's reader of a checkpoint directory
NOT_CHECKPOINTS = ("json", "yaml", "pickle", "tomllib", "toml", "np", "numpy")  # their load reads data, not state
LOOKS_INSIDE = ("join", "glob", "rglob", "iterdir", "listdir", "scandir", "joinpath", "walk")
OPENS = ("open",)  # open(x) as f: f is x's content


@dataclass(frozen=True)
class Load:
    call: str  # the load call reached ("torch.load")
    form: str  # what the value must be: "file", "directory" or "either"
    where: str  # file:line


@dataclass
class ResumeReading:
    flows: list = field(default_factory=list)  # (target names, value refs, looks inside, where) per assignment
    loads: list = field(default_factory=list)  # (refs of its arguments, refs looked inside, Load)
    functions: dict = field(default_factory=dict)  # function name -> its parameter names
    calls: list = field(default_factory=list)  # (function name, [(parameter or index, refs, inside)])
    documented: dict = field(default_factory=dict)  # flag -> its help text, where the help says "resume"

    def reaches(self, names: set[str]) -> Load | None:
        """The load call a value named ``names`` reaches (None: not shown)."""
        tainted = dict.fromkeys(names, False)  # name -> whether the script looks inside it (a directory)
        for _ in range(12):  # bounded: each round follows one more step of the flow
            grown = False
            for targets, refs, inside, _where in self.flows:
                hit = [r for r in refs if r in tainted]
                if not hit:
                    continue
                dirish = any(tainted[r] for r in hit) or bool(set(hit) & inside)
                for t in targets:
                    if t not in tainted or (dirish and not tainted[t]):
                        tainted[t] = tainted.get(t, False) or dirish
                        grown = True
            for name, bound in self.calls:
                params = self.functions.get(name)
                if not params:
                    continue
                for slot, refs, inside in bound:
                    hit = [r for r in refs if r in tainted]
                    param = params[slot] if isinstance(slot, int) and slot < len(params) else slot
                    if hit and isinstance(param, str) and param not in tainted:
                        tainted[param] = any(tainted[r] for r in hit) or bool(set(hit) & inside)
                        grown = True
            if not grown:
                break
        for refs, inside, load in self.loads:
            hit = [r for r in refs if r in tainted]
            if hit:
                dirish = any(tainted[r] for r in hit) or bool(set(hit) & inside)
                return Load(load.call, "directory" if dirish else load.form, load.where)
        return None


def _refs(node: ast.AST | None) -> tuple[set[str], set[str]]:
    """The names an expression reads (a name, an attribute's last part, a string key of a subscript or of
    ``.get``/``getenv``/``getattr``), and those it looks inside (joins onto, lists, globs)."""
    refs: set[str] = set()
    inside: set[str] = set()
    todo = [node] if node is not None else []
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name):
            refs.add(n.id)
        elif isinstance(n, ast.Attribute):
            refs.add(n.attr)
        elif isinstance(n, ast.Subscript):
            key = n.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                refs.add(key.value)
            else:
                todo.append(n.value)
        elif isinstance(n, ast.Call):
            name = call_name(n.func)
            last = name.split(".")[-1]
            args = list(n.args) + [k.value for k in n.keywords]
            if last in ("get", "getenv", "getattr", "pop") and n.args and isinstance(n.args[-1 if last == "getattr"
                                                                                          else 0], ast.Constant):
                key = n.args[1 if last == "getattr" and len(n.args) > 1 else 0]
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    refs.add(key.value)
            if isinstance(n.func, ast.Attribute):  # a method: what it is called on is read
                base_refs, base_inside = _refs(n.func.value)
                refs |= base_refs
                inside |= base_inside | (base_refs if last in LOOKS_INSIDE else set())
            if last in LOOKS_INSIDE and n.args:  # os.path.join(x, ...), os.listdir(x)
                first, _ = _refs(n.args[0])
                inside |= first
            todo.extend(args)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):  # Path(x) / "name"
            left, left_inside = _refs(n.left)
            right, right_inside = _refs(n.right)
            refs |= left | right
            inside |= left | left_inside | right_inside
        elif isinstance(n, ast.JoinedStr):  # f"{x}/name"
            parts = n.values
            for i, v in enumerate(parts):
                if isinstance(v, ast.FormattedValue):
                    r, ins = _refs(v.value)
                    refs |= r
                    inside |= ins
                    nxt = parts[i + 1] if i + 1 < len(parts) else None
                    if isinstance(nxt, ast.Constant) and str(nxt.value).startswith(("/", "\\")):
                        inside |= r
        else:
            todo.extend(ast.iter_child_nodes(n))
    return refs, inside


def _targets(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _load_of(call: ast.Call, where: str) -> tuple[list[ast.AST], Load] | None:
    """The arguments that name what ``call`` loads, and the load; None for a call that loads no checkpoint."""
    name = call_name(call.func)
    parts = name.split(".")
    for k in call.keywords:
        if k.arg in LOAD_KEYWORDS:
            return [k.value], Load(f"{parts[-1] or 'call'}({k.arg}=...)", LOAD_KEYWORDS[k.arg], where)
    if parts[-1] in DIRECTORY_READERS:
        return list(call.args), Load(name, "directory", where)
    if parts[-1] not in LOAD_CALLS or (len(parts) > 1 and parts[-2] in NOT_CHECKPOINTS):
        return None
    form = LOAD_CALLS[parts[-1]]
    if parts[-1] == "load" and len(parts) > 1 and parts[-2] in ("dcp", "checkpoint"):
        form = "directory"
    if parts[-1] == "load_checkpoint" and any(p in ("engine", "model_engine", "deepspeed") for p in parts[:-1]):
        form = "directory"
    return [*call.args, *(k.value for k in call.keywords)], Load(name, form, where)


def _read(tree: ast.Module, path: str, out: ResumeReading) -> None:
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            out.functions.setdefault(node.name, [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]
                                                 if p.arg not in ("self", "cls")])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = set().union(*(_targets(t) for t in (node.targets if isinstance(node, ast.Assign)
                                                          else [node.target])))
            refs, inside = _refs(node.value)
            out.flows.append((targets, refs, inside, where))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            refs, inside = _refs(node.iter)
            out.flows.append((_targets(node.target), refs, inside | refs if inside else inside, where))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    refs, inside = _refs(item.context_expr)
                    out.flows.append((_targets(item.optional_vars), refs, inside, where))
        elif isinstance(node, ast.Call):
            name = call_name(node.func)
            _argument_help(node, name, out)
            load = _load_of(node, where)
            if load is not None:
                refs, inside = set(), set()
                for a in load[0]:
                    r, i = _refs(a)
                    refs |= r
                    inside |= i
                out.loads.append((refs, inside, load[1]))
            last = name.split(".")[-1]
            if last:
                bound = [(i, *_refs(a)) for i, a in enumerate(node.args)]
                bound += [(k.arg, *_refs(k.value)) for k in node.keywords if k.arg]
                out.calls.append((last, bound))


def _argument_help(node: ast.Call, name: str, out: ResumeReading) -> None:
    if not name.endswith("add_argument"):
        return
    text = next((k.value.value for k in node.keywords if k.arg == "help" and isinstance(k.value, ast.Constant)
                 and isinstance(k.value.value, str)), "")
    if "resum" in text.lower():
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                out.documented[a.value] = text


def read_resume(path: str | Path) -> ResumeReading:
    """The script's loads and flows, with the modules of its own project (``script_project``)."""
    from autotune.exports.script_project import project_modules

    out = ResumeReading()
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return out
    _read(tree, Path(path).name, out)
    for p, t in project_modules(Path(path), tree).modules:
        _read(t, Path(p).name, out)
    return out


def form_not_shown(reading: ResumeReading | None, names: set[str], flag: str | None, resume_path: Path | None) -> str:
    """Where a directory is handed to a flag (its value named ``names`` in the code) whose load the source does not
    show (timm's --resume reaches its library's resume_checkpoint, outside the script's project): said, with the
    newest file to give if the flag loads a file; '' where the form is shown, nothing is handed, or a file is."""
    if resume_path is None or flag is None or not resume_path.is_dir():
        return ""
    if reading is not None and reading.reaches(names) is not None:
        return ""
    files = [p for p in resume_path.rglob("*") if p.is_file() and not p.is_symlink() and not p.name.startswith(".")]
    newest = max(files, key=lambda p: (p.stat().st_mtime, p.name)) if files else None
    return (f"; whether {flag} loads a file or a directory is not shown from its source (no load call reached), and "
            f"it is handed the directory {resume_path}"
            + (f": if it loads a file, give --resume_from {newest}" if newest else ""))


def never_told_where(facts, placeholders, wired: dict, args: list[str], run_dir: Path) -> str:
    """Why ``--resume_from auto`` would never find a checkpoint of this script's, or '': it looks only in the run's
    {checkpoint_dir}, and a script saves there only if it is told where that is (a {checkpoint_dir} or {run_dir}
    placeholder, a wired checkpoint flag, an argument inside the run directory, $AUTOTUNE_CHECKPOINT_DIR or
    $AUTOTUNE_RUN_DIR read, or autotune's Python API). imagenet's main.py saves checkpoint.pth.tar in its working
    directory: told none of these, its resume flag is never passed anything."""
    from autotune.rundir.layout import CHECKPOINT_DIR_ENV, RUN_DIR_ENV

    if facts is None or facts.uses_autotune or {"checkpoint_dir", "run_dir"} & set(placeholders) or \
            "checkpoint_dir" in wired or {CHECKPOINT_DIR_ENV, RUN_DIR_ENV} & set(facts.env_reads):
        return ""
    inside = {str(run_dir), str(Path(run_dir).absolute())}
    if any(where in str(a) for a in args for where in inside):
        return ""
    return ("; but nothing tells the script where the run's {checkpoint_dir} is, the only place --resume_from auto "
            "looks, so it finds nothing there on any launch and the script starts over each time: give its "
            "checkpoint-path flag {checkpoint_dir} after `--` (or have it save under $" + CHECKPOINT_DIR_ENV + ")")


def why_no_resume(entry: str | None, script_args: list[str], wire_auto: bool) -> str | None:
    """Why a requeued job of this script would start over (None: it can resume, or the built-in training, which
    always can): a user's script resumes when it reads autotune's resume point ({resume_from} in its arguments,
    $AUTOTUNE_RESUME_FROM, the Python API, a resume flag --wire auto passes or the user's own resume flag) or loads
    from a path it is given inside the run directory, shown from its source (``read_resume``)."""
    from autotune.exports.script_scan import FLAGS, scan_script

    if not entry or not entry.endswith(".py"):
        return None
    facts = scan_script(entry)
    if facts.error or facts.uses_autotune or RESUME_FROM_ENV in facts.env_reads:
        return None
    args = [str(a) for a in script_args]
    wired = {"checkpoint_dir": "wired"} if wire_auto and any(f in facts.flags for f in FLAGS["checkpoint_dir"]) else {}
    placeholders = [k for k in ("checkpoint_dir", "run_dir") if any(f"{{{k}}}" in a for a in args)]
    never = never_told_where(facts, placeholders, wired, [], Path("\0"))  # no run directory in a job's arguments
    if any("{resume_from}" in a for a in args) or any(a.split("=")[0] in FLAGS["resume_from"] for a in args) or \
            wire_auto and any(f in facts.flags for f in FLAGS["resume_from"]):
        return f"{entry} takes a resume point,{never[1:]}" if never else None
    reading = read_resume(entry)
    for i, a in enumerate(args):  # a path it is given inside the run directory, that it loads from
        if "{checkpoint_dir}" in a or "{run_dir}" in a:
            flag = a.split("=")[0] if "=" in a else args[i - 1] if i and args[i - 1].startswith("-") else None
            if flag and reading.reaches({facts.dests.get(flag) or flag.lstrip("-+~").replace("-", "_").split(".")[-1]}):
                return None
    return (f"{entry} is not shown to load any checkpoint it is given (no {{resume_from}}, no resume flag, no path "
            "inside the run directory that reaches a load call), so a requeued job would start over; "
            f"{facts.resume_hint(RESUME_FROM_ENV)}" + (f"; and{never[len('; but'):]}" if never else ""))
