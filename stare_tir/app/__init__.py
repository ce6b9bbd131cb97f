"""The process around a run: entry points (`cli`), the SFT -> RL -> evaluation job (`pipeline`), run
directories (`run_dir`) and start-up checks (`preflight`)."""
