"""NVML's figure of a job against torch's allocator: NVML sees every byte the allocator reserves, so
a job's NVML peak above its start falls below the allocator's reserved peak only where the job
reused memory reserved before it started (a kept rank's leftover segment, which NVML counted in the
starting level); the train benchmark records by how much (``nvml_shortfall_bytes``) and says so past
a few MiB."""

from sweepbench.train.memory import GIB, NVML_SHORTFALL_SLACK, nvml_shortfall

MIB = 1 << 20


def test_a_job_that_reused_memory_reserved_before_it_is_short_by_that_much() -> None:
    # a kept rank whose cuBLAS workspaces had kept 7.861328125 GiB of the job before reserved (one H200):
    # the fused LoRA job's reserved peak 17.451171875 GiB, NVML 9.58984375 GiB above its start
    short = nvml_shortfall(int(9.58984375 * GIB), int(17.451171875 * GIB))
    assert short == int(7.861328125 * GIB) and short > NVML_SHORTFALL_SLACK


def test_a_job_that_set_up_more_than_the_allocator_is_not_short() -> None:
    # a fresh rank: NVML counts the libraries' set-up beside the allocator's segments
    assert nvml_shortfall(int(18.064453125 * GIB), int(17.919921875 * GIB)) == 0
    # a kept rank whose allocator handed its cache back: 2 MiB of small blocks reserved before the job
    short = nvml_shortfall(int(17.91796875 * GIB), int(17.919921875 * GIB))
    assert short == 2 * MIB and short <= NVML_SHORTFALL_SLACK


def test_unknown_where_nvml_or_the_allocator_says_nothing() -> None:
    assert nvml_shortfall(None, 1) is None
    assert nvml_shortfall(1, None) is None
