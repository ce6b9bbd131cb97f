"""Evaluation: sampling and grading a benchmark (`evaluate`), pure metrics (`metrics`) and the `stare-eval`
command (`command`: output directories, run directories as models)."""
