"""What a launch says before it starts (and ``--dry-run`` instead of starting): what changed since the
checkpoint it resumes from, and how each of the plan's values is handed to a user's script."""

from __future__ import annotations

import sys


def resume_note(setup) -> str:
    """What differs from the checkpoint's training values: applied, and said before the launch."""
    from autotune.rundir.checkpoints import describe_changes, read_meta, resume_changes

    if setup.plan.run.entrypoint:
        return ""
    changes = resume_changes(read_meta(setup.resume_path), setup.plan)
    if not changes:
        return ""
    return f"\n  changed since that checkpoint (applied from its step on): {describe_changes(changes)}"


def print_delivery(setup, out=None) -> None:
    out = out or sys.stdout
    d = setup.delivery
    if d is None or not setup.plan.run.entrypoint:
        return
    # handed over, not delivered: what the script really ran is observed in its first steps (evidence.py)
    observed = setup.plan.run.observe
    print("How the plan is handed to your script" + (" (what it runs is observed in its first steps):" if observed
                                                      else " (not observed: --no_observe):"), file=out)
    for k, routes in d.routes.items():
        print(f"  {k}: {'; '.join(routes) if routes else 'NO ROUTE (advisory)'}", file=out)
    if d.resume:
        print(("warning: " if d.resume.startswith("none:") else "  ") + f"resume_from: {d.resume}", file=out)
    for line in d.summary():
        print(f"warning: {line}", file=out)
    hint = d.advisory_hint() if d.advisory else ""
    if hint:  # none where every advisory value is said in its own note (an accumulation the script derives)
        print(f"  {hint}", file=out)
