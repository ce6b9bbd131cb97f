"""stare-tir: RL trainer for tool-integrated reasoning agents (GRPO family + STARE)."""

__version__ = "0.1.0"
