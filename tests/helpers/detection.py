"""Detection on recorded machines: a fake psutil, a recorded cgroup tree, and ``detect`` with nothing of this
machine's (no cgroup files, no /sys/class, the fake psutil unless given)."""

from autotune.hardware import detect


class FakePsutil:
    def __init__(self, logical=8, physical=4, total_mib=32768, avail_mib=30000, fail=False):
        self.logical, self.physical, self.total, self.avail, self.fail = logical, physical, total_mib, avail_mib, fail

    def cpu_count(self, logical=True):
        if self.fail:
            raise OSError("no /proc")
        return self.logical if logical else self.physical

    def Process(self):
        from types import SimpleNamespace
        return SimpleNamespace(cpu_affinity=lambda: list(range(self.logical)))

    def virtual_memory(self):
        if self.fail:
            raise OSError("no /proc/meminfo")
        from types import SimpleNamespace
        return SimpleNamespace(total=self.total * 2**20, available=self.avail * 2**20)


def run_detect(tmp_path, nvml, environ=None, **kw):
    return detect(nvml=nvml, environ=environ or {}, cgroup_root=tmp_path / "nocgroup",
                  proc_self_cgroup=tmp_path / "nocgroup" / "self", sys_class=tmp_path / "sysclass",
                  psutil_module=kw.pop("psutil_module", FakePsutil()), **kw)


def write_tree(root, files):
    """A recorded cgroup hierarchy: {relative path: file text}."""
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root
