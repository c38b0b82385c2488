"""Whether a resumed launch's script continued from its checkpoint, judged from what its ranks did at their first
optimizer step (``autotune.runtime.observe_resume``): never from the arguments it was given.

- continued, at step N: the optimizer's state counted N steps before the first one (its step counter reads N + 1
  after it), or a learning-rate scheduler stood at step N;
- continued, step not observable: it read the resume point (or, for its own resume flag, a checkpoint) and loaded
  state into its model or optimizer before its first step, where no step counter or scheduler past its first step
  says where (SGD keeps no counter; a per-epoch scheduler stands at 1 early on): said as what was loaded;
- started over: none of these (its optimizer counted from 1, nothing was loaded): the checkpoints it writes from
  now on overwrite the ones it should have continued.
"""

from __future__ import annotations

from pathlib import Path

from autotune.rundir.layout import RESUME_FROM_ENV


def _inside(path: str, where: str) -> bool:
    """``path`` is ``where`` or lies inside it, or ``where`` lies inside ``path`` (a flag given a directory reads a
    file in it; one given a file in a folder may read the folder)."""
    a, b = Path(path), Path(where)
    return a == b or b in a.parents or a in b.parents


def _one(rec: dict, resume: str | None) -> dict | None:
    """One rank's word (None: its record carries no first step)."""
    first = rec.get("first_step")
    if not isinstance(first, dict):
        return None
    counter, epoch = first.get("optimizer_step"), first.get("scheduler_epoch")
    loads = [x for x in rec.get("loads") or [] if isinstance(x, dict) and not x.get("before_step")]
    read = [x["path"] for x in loads
            if isinstance(x.get("path"), str) and (resume is None or _inside(x["path"], resume))]
    state = [s for s in first.get("state_loaded") or [] if s in ("model", "optimizer", "scheduler")]
    if isinstance(counter, int) and counter > 1:
        return {"status": "resumed", "step": counter - 1, "loaded": read[:1], "by": "its optimizer's step counter"}
    if isinstance(epoch, int) and epoch > 1:
        return {"status": "resumed", "step": epoch, "loaded": read[:1], "by": "its learning-rate scheduler"}
    if read and state:
        return {"status": "resumed", "step": None, "loaded": read[:1], "by": f"loaded into its {' and '.join(state)}",
                "state_loaded": state}
    return {"status": "started over", "step": None, "loaded": read[:1], "by": None,
            "optimizer_step": counter, "state_loaded": state}


def resume_verdict(observed: list[dict], resume: str | None) -> dict | None:
    """The resume as observed, from the ranks that trained (the lowest one that continued speaks for them), or
    None when no record carries its first step. ``resume``: the path the launch handed over (None: the script
    chose its own, under its own resume flag)."""
    words = [w for w in (_one(r, resume) for r in sorted(observed, key=lambda r: r["rank"]) if r.get("steps")) if w]
    if not words:
        return None
    return next((w for w in words if w["status"] == "resumed"), words[0])


def resume_said(v: dict) -> str:
    """The judgement line's words on the resume."""
    if v["status"] == "resumed":
        at = f"at step {v['step']}" if v["step"] is not None else \
            f"(the step it resumed at is not observable: {_why_no_step(v.get('state_loaded') or ())})"
        where = f" from {v['loaded'][0]}" if v["loaded"] else ""
        return f"resumed{where} {at} ({v['by']})"
    return "started over (not resumed)"


def _why_no_step(state) -> str:
    """Why no step was seen, as true of what was loaded: an optimizer whose state keeps no step counter (SGD) and a
    scheduler that stood at its first step are loaded, not fresh."""
    loaded = [s for s in ("optimizer", "scheduler") if s in state]
    if not loaded:
        return "its optimizer and schedulers start fresh"
    return (f"its {' and '.join(loaded)} {'were' if len(loaded) > 1 else 'was'} loaded, but "
            + ("its optimizer's state keeps no step counter" if "optimizer" in loaded else "its optimizer starts "
               "fresh") + (" and its scheduler stood at its first step" if "scheduler" in loaded else
                           " and its schedulers start fresh"))


def started_over(v: dict, resume: str | None, flag: str | None) -> str:
    """Why a resumed launch is wrong when its script started over, and the fix."""
    what = f"the launch resumes from {resume}" if resume else "the launch resumes (your own resume flag)"
    counter = v.get("optimizer_step")
    seen = (f"its optimizer's first step counted from {counter}" if counter else "its first optimizer step continued "
            "no optimizer or scheduler state") + (", and it loaded nothing before it" if not v["loaded"] else
                                                  f"; it read {v['loaded'][0]} but loaded no state from it")
    how = f"its {flag} must load the checkpoint it is given" if flag else f"the script must load {{resume_from}} (or " \
        f"${RESUME_FROM_ENV})"
    return (f"{what}, but the script started over: {seen}, so the checkpoints it writes overwrite the ones it should "
            f"continue; {how} into its model and optimizer before its first step (torch.load + load_state_dict), "
            "or launch without --resume_from")
