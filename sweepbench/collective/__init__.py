"""The collective engine: collective operations as nccl-tests measures them (``ops``: buffers with
known inputs, the exact expected output, the bus-bandwidth factor, and the torch implementation
that times them), NVIDIA's nccl-tests binaries as a peer (``nccl_tests``), and who runs the
collective benchmark's cases, by name (``impls``). The package import stays torch-free: the
driver checks a job against ``impls`` before any rank starts."""
