"""`ktdeploy tune`: measure the CPU-expert settings with short real training trials instead of guessing them."""
