"""Tasks for the trainer: the Retool code-interpreter environment, answer grading, problem data
and the synthetic arithmetic task. Depends on `sandbox` only, never on torch or `stare_tir`.

Import the submodules directly (`envs.grading`, `envs.data`, `envs.retool`, `envs.arithmetic`);
this package file stays empty so that `import envs.grading` loads nothing else.
"""
