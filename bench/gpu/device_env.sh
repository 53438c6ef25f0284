# Sourced (`. bench/gpu/device_env.sh`) by the device scripts, from the repository root: NVLink
# multicast off (as the lent machines require), unbuffered Python, wandb offline; on a GPU machine
# (CPU unset) the carried wheels (.whl, from ../shared/device/wheels.sh) installed into /tmp/site
# and put on the paths (once: a script that sources it again with SITE_READY=1 set, as x4_wave.sh's
# streams do, skips the install); with CPU=1 the checkout alone.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 WANDB_MODE=offline
if [ -z "${CPU:-}" ]; then
  [ -n "${SITE_READY:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
