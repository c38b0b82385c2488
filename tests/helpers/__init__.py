"""What several test files share (tests/ is on sys.path: tests/conftest.py puts it there): ``support`` (ROOT,
``require``, free ports, the in-process CLI), ``fake_nvml`` and ``detection`` (fake drivers and recorded machine
files for detection), ``profiles_util`` (hand-written profiles), ``trace_models`` (small models, importable as
``helpers.helpers.trace_models:<factory>``), ``gpu_truth`` (what an H100 recorded), ``multiprocess`` (the small config,
launching and reading a run's records, for tests/multiprocess). A test file never imports another test file."""
