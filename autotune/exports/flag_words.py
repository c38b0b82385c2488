"""The script's own flags by the words they are spelled with (pure): which declared flag is near a plan value
(llm.c's --num_iterations for the step count, --dtype for the precision), and the value an argument list gives a flag.
A hint names only a flag the script declares.
"""

from __future__ import annotations

# the words a script's own flag for each value is spelled with (llm.c's --num_iterations, --dtype; timm's --amp):
# a hint names a declared flag near the value, never one the script lacks
NEAR_WORDS = {"micro_batch_size": ("batch", "bs"),
              "gradient_accumulation_steps": ("accum", "accumulate", "accumulation"),
              "learning_rate": ("lr", "learning"), "precision": ("precision", "dtype", "amp", "fp16", "bf16", "half"),
              "num_workers": ("workers",), "max_steps": ("steps", "iters", "iterations", "iter"),
              "epochs": ("epochs", "epoch"), "warmup_steps": ("warmup",), "world_size": ()}


def words_of(flag: str) -> list[str]:
    return flag.lstrip("-").replace("-", "_").replace(".", "_").split("_")


def near_flags(key: str, flags) -> list[str]:
    """The script's declared flags whose words are the value's (``--num_iterations`` for max_steps)."""
    words = NEAR_WORDS.get(key, ())
    return [f for f in flags if any(w in words for w in words_of(f)) and not (key == "max_steps" and "warmup" in f)]


def value_of(flag: str, args: list[str]) -> str | None:
    """The value ``args`` give ``flag`` (``--x 8`` or ``--x=8``; the last one wins, as argparse takes it)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def flag_form(key: str, word: str, flags, switches) -> str:
    """How ``key``'s placeholder goes to the flags an argparse script declares near it ('' where none): a flag whose
    name says dtype takes torch's dtype name ({dtype}: bfloat16); a switch (store_true: timm's --amp) takes no
    value, so it is named as a switch and never given a placeholder."""
    near = near_flags(key, flags)
    on = [f for f in near if f in switches]
    forms = [f"{f} {{{'dtype' if key == 'precision' and 'dtype' in words_of(f) else key}}}" for f in near
             if f not in switches]
    said_on = f"{' and '.join(on)}: {'a switch' if len(on) == 1 else 'switches'}, no value" if on else ""
    if len(forms) == 1:
        return f"{forms[0]} (if that is its {word}" + (f"; {said_on})" if on else ")")
    if forms:
        return f"its {word} flag among {', '.join(forms)}" + (f" ({said_on})" if on else "")
    if on:
        return f"its {word} switch {' or '.join(on)} (it takes no value: a placeholder cannot reach it)"
    return ""
