"""A resume across engine families (DeepSpeed against torch's) is refused by name; within one it is allowed."""

import pytest


@pytest.mark.parametrize("saved_by, backend, refused", [
    ("deepspeed", "ddp", True), ("deepspeed", "single", True), ("ddp", "deepspeed", True),
    ("single", "ddp", False), ("ddp", "single", False), ("deepspeed", "deepspeed", False),
])
def test_resume_across_engine_families_is_refused(saved_by, backend, refused):
    from autotune.errors import UserError
    from autotune.rundir.checkpoints import check_compatible

    meta = {"backend": saved_by, "global_batch_size": 32}
    if refused:
        with pytest.raises(UserError, match=f"written by the {saved_by} backend"):
            check_compatible(meta, "/c", backend, 32)
    else:
        check_compatible(meta, "/c", backend, 32)
