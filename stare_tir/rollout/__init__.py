"""Rollouts: multi-turn, token-in/token-out trajectories from a backend and an env.

engine.RolloutEngine / RolloutConfig   the per-trajectory state machine, run concurrently
trajectory.Trajectory                  the record the learner trains on
backends/                              hf (in-process), sglang (HTTP / Engine), stand-in
"""
