"""Other engines run on this harness's prompts as peer rows (graft/peers/vllm_runner.py), in environments of their own."""
