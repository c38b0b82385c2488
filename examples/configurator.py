# Overrides the settings of the script that exec's this file (examples/gpt_style_train.py) from its arguments:
#   python gpt_style_train.py --batch_size=32 --dtype=bfloat16
# Each --name=value must name a setting the script already has; the value is read as a Python literal when it is
# one (32, 1e-3, True), else kept as text (bfloat16), and must keep the setting's type. No other argument is taken.
# (exec'd, not imported: it changes the script's own globals.)
import ast as _ast
import sys as _sys

for _arg in _sys.argv[1:]:
    _name, _eq, _text = _arg.removeprefix("--").partition("=")
    if not _arg.startswith("--") or not _eq or _name not in globals() or _name.startswith("_"):
        raise SystemExit(f"configurator: {_arg!r} is not --name=value for one of the script's settings")
    try:
        _value = _ast.literal_eval(_text)
    except (SyntaxError, ValueError):
        _value = _text
    if type(_value) is not type(globals()[_name]):
        raise SystemExit(f"configurator: --{_name} needs a {type(globals()[_name]).__name__}, not {_text!r}")
    print(f"configurator: {_name} = {_value!r}")
    globals()[_name] = _value
